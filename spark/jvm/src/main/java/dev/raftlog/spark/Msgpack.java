package dev.raftlog.spark;

import java.nio.charset.StandardCharsets;

/**
 * A MessagePack cursor over [at, end) of a byte array, reading the types a WAL page and a
 * record use, as msgspec does: strings must be valid UTF-8, byte strings are bin (not str).
 * What does not hold is {@link #MALFORMED}, or {@link #ENDS_EARLY} where the bytes run out before
 * a value or a length needs them: exceptions without a stack trace (raw data is not a bug: its row
 * is built without a trace per row). A reader with its own messages ({@link Page}) tells them
 * apart by {@link Malformed#early}.
 */
final class Msgpack {
  static final class Malformed extends RuntimeException {
    private static final long serialVersionUID = 1L;

    /** Whether the bytes ran out (a value or a length past the end), not a wrong type. */
    final boolean early;

    private Malformed(boolean early) {
      super(early ? "MessagePack that ends early" : "malformed MessagePack", null, false, false);
      this.early = early;
    }
  }

  static final Malformed MALFORMED = new Malformed(false);
  static final Malformed ENDS_EARLY = new Malformed(true);
  private static final int MAX_DEPTH = 64;

  byte[] b;
  int at;
  int end;
  int start; // where the last str or bin read begins

  void reset(byte[] buf, int from, int to) {
    b = buf;
    at = from;
    end = to;
  }

  private int u8() {
    if (at >= end) {
      throw ENDS_EARLY;
    }
    return b[at++] & 0xff;
  }

  private int u16() {
    return u8() << 8 | u8();
  }

  private long u32() {
    return (long) u16() << 16 | u16();
  }

  private int length(long n) {
    if (n > end - at) {
      throw ENDS_EARLY;
    }
    return (int) n;
  }

  int mapLen() {
    int t = u8();
    if ((t & 0xf0) == 0x80) {
      return t & 0x0f;
    }
    return t == 0xde ? u16() : t == 0xdf ? length(u32()) : fail();
  }

  int arrayLen() {
    int t = u8();
    if ((t & 0xf0) == 0x90) {
      return t & 0x0f;
    }
    return t == 0xdc ? u16() : t == 0xdd ? length(u32()) : fail();
  }

  /** Whether the next value is an array (without reading it). */
  boolean atArray() {
    int t = peek();
    return (t & 0xf0) == 0x90 || t == 0xdc || t == 0xdd;
  }

  /** Whether the next value is a bin (without reading it). */
  boolean atBin() {
    int t = peek();
    return t >= 0xc4 && t <= 0xc6;
  }

  /** The next byte, or -1 past the end. */
  private int peek() {
    return at < end ? b[at] & 0xff : -1;
  }

  private static int fail() {
    throw MALFORMED;
  }

  boolean nil() {
    if (at < end && (b[at] & 0xff) == 0xc0) {
      at++;
      return true;
    }
    return false;
  }

  /** A bin's length (its bytes from {@link #start}), or -1 for nil. */
  int nullableBin() {
    return nil() ? -1 : bin();
  }

  int bin() {
    long n = binHeader();
    start = at;
    at += length(n);
    return (int) n;
  }

  /**
   * A bin's length as its header says, the cursor at its first byte: not yet checked against the
   * bytes left, as {@link #bin} checks it.
   */
  long binHeader() {
    int t = u8();
    return t == 0xc4 ? u8() : t == 0xc5 ? u16() : t == 0xc6 ? u32() : fail();
  }

  /** A valid UTF-8 string's length in bytes (its bytes from {@link #start}). */
  int str() {
    int n = strBytes();
    if (!Utf8.valid(b, start, at)) {
      throw MALFORMED;
    }
    return n;
  }

  /** A string's length in bytes (its bytes from {@link #start}), not checked to be UTF-8. */
  int strBytes() {
    int t = u8();
    long n;
    if ((t & 0xe0) == 0xa0) {
      n = t & 0x1f;
    } else {
      n = t == 0xd9 ? u8() : t == 0xda ? u16() : t == 0xdb ? u32() : fail();
    }
    start = at;
    at += length(n);
    return (int) n;
  }

  String string() {
    int n = str();
    return new String(b, start, n, StandardCharsets.UTF_8);
  }

  long integer() {
    int t = u8();
    if (t <= 0x7f) {
      return t;
    }
    if (t >= 0xe0) {
      return (byte) t;
    }
    return switch (t) {
      case 0xcc -> u8();
      case 0xcd -> u16();
      case 0xce -> u32();
      case 0xcf, 0xd3 -> u32() << 32 | u32();
      case 0xd0 -> (byte) u8();
      case 0xd1 -> (short) u16();
      case 0xd2 -> (int) u32();
      default -> throw MALFORMED;
    };
  }

  /** An integer that fits a signed 64-bit long: a uint64 past it is malformed here. */
  long int64() {
    boolean unsigned64 = at < end && (b[at] & 0xff) == 0xcf;
    long v = integer();
    if (unsigned64 && v < 0) {
      throw MALFORMED;
    }
    return v;
  }

  /** Past one value of any type. */
  void skip(int depth) {
    if (depth > MAX_DEPTH) {
      throw MALFORMED;
    }
    int t = b[at < end ? at : fail()] & 0xff;
    if (t <= 0x7f || t >= 0xe0 || (t >= 0xcc && t <= 0xd3)) {
      integer();
    } else if ((t & 0xe0) == 0xa0 || (t >= 0xd9 && t <= 0xdb)) {
      str();
    } else if (t >= 0xc4 && t <= 0xc6) {
      bin();
    } else if ((t & 0xf0) == 0x90 || t == 0xdc || t == 0xdd) {
      for (int i = arrayLen(); i > 0; i--) {
        skip(depth + 1);
      }
    } else if ((t & 0xf0) == 0x80 || t == 0xde || t == 0xdf) {
      for (int i = 2 * mapLen(); i > 0; i--) {
        skip(depth + 1);
      }
    } else if (t == 0xc0 || t == 0xc2 || t == 0xc3) {
      at++;
    } else if (t == 0xca || t == 0xcb) {
      at++;
      at += length(t == 0xca ? 4 : 8);
    } else {
      throw MALFORMED; // ext types: msgspec decodes none of them into a record's fields
    }
  }
}
