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

  Page(byte[] buf) {
    this.buf = buf;
  }

  /** The page in {@code raw}; IllegalArgumentException when it is not one. */
  static Page parse(byte[] raw) {
    Page p = new Page(raw);
    p.read();
    return p;
  }

  /** Read through {@link Msgpack}'s cursor, its failures told in the page's own words. */
  private void read() {
    Msgpack in = new Msgpack();
    in.reset(buf, 0, buf.length);
    int fields;
    try {
      fields = in.mapLen();
    } catch (Msgpack.Malformed e) {
      throw bad(e, "not a MessagePack map: ", 0);
    }
    for (int i = 0; i < fields; i++) {
      int at = in.at;
      String name;
      try {
        int n = in.strBytes(); // not checked to be UTF-8: a name not valid is one not read
        name = new String(buf, in.start, n, StandardCharsets.UTF_8);
      } catch (Msgpack.Malformed e) {
        throw bad(e, "a field name that is not a string: ", at);
      }
      at = in.at;
      try {
        if (in.atBin()) {
          long len = in.binHeader();
          if (len > in.end - in.at) {
            throw new IllegalArgumentException("a buffer of " + len + " bytes past the page's end");
          }
          Span s = span(name);
          if (s != null) {
            s.buf = buf;
            s.offset = in.at;
            s.length = (int) len;
          }
          in.at += (int) len;
        } else {
          long v = in.integer();
          switch (name) {
            case "partition" -> partition = v;
            case "count" -> count = v;
            case "next" -> next = v;
            default -> { } // high_water_mark, compaction_floor: not needed to read
          }
        }
      } catch (Msgpack.Malformed e) {
        throw bad(e, "an unexpected value: ", at);
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

  /**
   * The page's own message where the cursor failed: its bytes ran out, or the value at {@code at}
   * is not the one {@code wanted}.
   */
  private IllegalArgumentException bad(Msgpack.Malformed e, String wanted, int at) {
    return e.early
        ? new IllegalArgumentException("the page ends early", e)
        : new IllegalArgumentException(wanted + "0x" + Integer.toHexString(buf[at] & 0xff));
  }
}
