package dev.raftlog.spark;

import java.nio.charset.StandardCharsets;

/**
 * A {@code /columns} page (see the node's {@code columnar.py}): one MessagePack map of integers
 * and flat little-endian buffers. The buffers are not copied: each is a span of the answer's
 * bytes, which the column vectors read in place. Only the types the page uses are read. A page
 * a {@link ColumnsBuilder} built has the same layout, each span the start of one of its buffers.
 */
final class Page {
  final byte[] buf;
  long partition = -1;
  long count = -1;
  long next = -1;
  // [offset, length] of each buffer in buf, by field
  final Span index = new Span();
  final Span term = new Span();
  final Span timestampMs = new Span();
  final Span keyOffsets = new Span();
  final Span keyData = new Span();
  final Span keyValid = new Span();
  final Span valueOffsets = new Span();
  final Span valueData = new Span();
  final Span valueValid = new Span();
  final Span headerOffsets = new Span();
  final Span headerKeyOffsets = new Span();
  final Span headerKeyData = new Span();
  final Span headerValueOffsets = new Span();
  final Span headerValueData = new Span();

  static final class Span {
    byte[] buf;
    int offset = -1;
    int length;
  }

  private int at;

  Page(byte[] buf) {
    this.buf = buf;
  }

  /** The page in {@code raw}; IllegalArgumentException when it is not one. */
  static Page parse(byte[] raw) {
    Page p = new Page(raw);
    try {
      p.read();
    } catch (ArrayIndexOutOfBoundsException e) {
      throw new IllegalArgumentException("the page ends early", e);
    }
    return p;
  }

  private void read() {
    int head = u8();
    int fields;
    if ((head & 0xf0) == 0x80) {
      fields = head & 0x0f;
    } else if (head == 0xde) {
      fields = u16();
    } else if (head == 0xdf) {
      fields = (int) u32();
    } else {
      throw new IllegalArgumentException("not a MessagePack map: " + hex(head));
    }
    for (int i = 0; i < fields; i++) {
      String name = string();
      int tag = buf[at] & 0xff;
      if (tag == 0xc4 || tag == 0xc5 || tag == 0xc6) {
        Span s = span(name);
        at++;
        int len = binLength(tag);
        if (s != null) {
          s.buf = buf;
          s.offset = at;
          s.length = len;
        }
        at += len;
      } else {
        long v = integer();
        switch (name) {
          case "partition" -> partition = v;
          case "count" -> count = v;
          case "next" -> next = v;
          default -> { } // high_water_mark, compaction_floor: not needed to read
        }
      }
    }
    if (count < 0 || next < 0 || partition < 0 || index.offset < 0) {
      throw new IllegalArgumentException("a page without count, next, partition or index");
    }
    checkLength(index, 8 * count, "index");
    checkLength(term, 8 * count, "term");
    checkLength(timestampMs, 8 * count, "timestamp_ms");
    checkLength(keyOffsets, 4 * (count + 1), "key_offsets");
    checkLength(valueOffsets, 4 * (count + 1), "value_offsets");
    checkLength(keyValid, count, "key_valid");
    checkLength(valueValid, count, "value_valid");
    checkLength(headerOffsets, 4 * (count + 1), "header_offsets");
  }

  private static void checkLength(Span s, long want, String name) {
    if (s.offset < 0 || s.length != want) {
      throw new IllegalArgumentException(name + " holds " + s.length + " bytes, not " + want);
    }
  }

  private Span span(String name) {
    return switch (name) {
      case "index" -> index;
      case "term" -> term;
      case "timestamp_ms" -> timestampMs;
      case "key_offsets" -> keyOffsets;
      case "key_data" -> keyData;
      case "key_valid" -> keyValid;
      case "value_offsets" -> valueOffsets;
      case "value_data" -> valueData;
      case "value_valid" -> valueValid;
      case "header_offsets" -> headerOffsets;
      case "header_key_offsets" -> headerKeyOffsets;
      case "header_key_data" -> headerKeyData;
      case "header_value_offsets" -> headerValueOffsets;
      case "header_value_data" -> headerValueData;
      default -> null;
    };
  }

  private int binLength(int tag) {
    long n = tag == 0xc4 ? u8() : tag == 0xc5 ? u16() : u32();
    if (n > buf.length - at) {
      throw new IllegalArgumentException("a buffer of " + n + " bytes past the page's end");
    }
    return (int) n;
  }

  private String string() {
    int tag = u8();
    int len;
    if ((tag & 0xe0) == 0xa0) {
      len = tag & 0x1f;
    } else if (tag == 0xd9) {
      len = u8();
    } else if (tag == 0xda) {
      len = u16();
    } else {
      throw new IllegalArgumentException("a field name that is not a string: " + hex(tag));
    }
    String s = new String(buf, at, len, StandardCharsets.UTF_8);
    at += len;
    return s;
  }

  private long integer() {
    int tag = u8();
    if (tag <= 0x7f) {
      return tag;
    }
    if (tag >= 0xe0) {
      return (byte) tag;
    }
    return switch (tag) {
      case 0xcc -> u8();
      case 0xcd -> u16();
      case 0xce -> u32();
      case 0xcf, 0xd3 -> s64();
      case 0xd0 -> buf[at++];
      case 0xd1 -> (short) u16();
      case 0xd2 -> (int) u32();
      default -> throw new IllegalArgumentException("an unexpected value: " + hex(tag));
    };
  }

  private static String hex(int tag) {
    return "0x" + Integer.toHexString(tag);
  }

  private int u8() {
    return buf[at++] & 0xff;
  }

  private int u16() {
    return (u8() << 8) | u8();
  }

  private long u32() {
    return ((long) u16() << 16) | u16();
  }

  private long s64() {
    return (u32() << 32) | u32();
  }
}
