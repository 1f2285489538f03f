package dev.raftlog.spark;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.zip.CRC32C;

/**
 * A WAL page (the node's {@code walpage.py}, {@code /columns?format=wal}): committed records as
 * the WAL frames them ({@code length u32 | crc32c u32 | body}, little-endian). The node checks
 * nothing, so this reader does: every record's CRC32C, and entries that run on from the index
 * asked for to {@code next - 1} without a gap. A page that fails either is a replica's fault
 * (IllegalArgumentException: the caller asks the next replica), never rows.
 *
 * <p>COMMIT records and entries that are not NORMAL are skipped. A NORMAL entry's data is a
 * {@code raftlog.node.record.Record} as msgspec encodes it: an array of up to six fields (key
 * bin|nil, value bin|nil, headers map str:str or an array of [str, bin] pairs, timestamp_ms
 * int, producer_id str|nil, sequence int; missing trailing fields are defaults, extra ones
 * ignored). Data that is not one becomes
 * a row with a null key, the data as value and the header {@code raftlog.raw} = {@code true},
 * as the node's column page does. Rows land in a {@link ColumnsBuilder}: no object per row.
 */
final class WalPage {
  private static final byte[] RAW_HEADER =
      "raftlog.rawtrue".getBytes(StandardCharsets.US_ASCII); // key, then value
  private static final int T_ENTRY = 1;
  private static final int T_COMMIT = 2;
  private static final int ENTRY_HEAD = 18; // type u8, index u64, term u64, kind u8

  private final ColumnsBuilder cols = new ColumnsBuilder();
  private final CRC32C crc = new CRC32C();
  private final Msgpack mp = new Msgpack();
  private static final int MAX_KEPT_HEADERS = 4096;
  private int[] headers = new int[16]; // key offset, key length, value offset, value length

  /** The rows of the WAL page {@code raw[0, length)}, asked from {@code first}. */
  Page decode(byte[] raw, int length, long first) {
    long partition = -1;
    long next = -1;
    long pageFirst = -1;
    int records = -1;
    int recordsLen = 0;
    try {
      mp.reset(raw, 0, length);
      int fields = mp.mapLen();
      for (int i = 0; i < fields; i++) {
        String name = mp.string();
        if (name.equals("records")) {
          recordsLen = mp.bin();
          records = mp.start;
        } else if (name.equals("partition")) {
          partition = mp.integer();
        } else if (name.equals("next")) {
          next = mp.integer();
        } else if (name.equals("first")) {
          pageFirst = mp.integer();
        } else {
          mp.skip(0); // high_water_mark, compaction_floor: not needed to read
        }
      }
    } catch (Msgpack.Malformed e) {
      throw new IllegalArgumentException("a WAL page that is not a MessagePack map of its fields");
    }
    if (partition < 0 || next < 0 || records < 0 || pageFirst != first) {
      throw new IllegalArgumentException(
          "a WAL page without partition, next or records, or from " + pageFirst + " not "
              + first);
    }
    cols.clear();
    long expected = entries(raw, records, records + recordsLen, first);
    if (expected != next) {
      throw new IllegalArgumentException(
          "a WAL page whose entries end at " + (expected - 1) + ", not " + (next - 1));
    }
    return cols.build(partition, next);
  }

  /** Checks and decodes the records in [pos, end); the index after the last entry. */
  private long entries(byte[] b, int pos, int end, long expected) {
    while (pos < end) {
      if (end - pos < 8) {
        throw bad("a record header cut short", expected);
      }
      int len = le32(b, pos);
      int body = pos + 8;
      if (len <= 0 || len > end - body) {
        throw bad("a record length of " + Integer.toUnsignedString(len), expected);
      }
      crc.reset();
      crc.update(b, body, len);
      if (crc.getValue() != Integer.toUnsignedLong(le32(b, pos + 4))) {
        throw bad("a record checksum mismatch", expected);
      }
      int type = b[body] & 0xff;
      if (type == T_ENTRY && len >= ENTRY_HEAD) {
        long index = le64(b, body + 1);
        int kind = b[body + 17] & 0xff;
        if (index != expected) {
          throw bad("entry " + index, expected);
        }
        if (kind == 0) {
          cols.row(index, le64(b, body + 9));
          record(b, body + ENTRY_HEAD, body + len);
        } else if (kind > 2) {
          throw bad("an entry of unknown kind " + kind, expected);
        }
        expected++;
      } else if (type != T_COMMIT || len != 9) {
        throw bad("a record of unknown type " + type, expected);
      }
      pos = body + len;
    }
    return expected;
  }

  private static IllegalArgumentException bad(String what, long expected) {
    return new IllegalArgumentException(
        "a damaged WAL page: " + what + " where entry " + expected + " belongs");
  }

  /** The row of a NORMAL entry's data [from, end), a raw row when it is not a record. */
  private void record(byte[] b, int from, int end) {
    int keyOff = 0;
    int keyLen = -1;
    int valueOff = 0;
    int valueLen = -1;
    int pairs = 0;
    long millis = 0;
    try {
      mp.reset(b, from, end);
      int fields = mp.arrayLen();
      if (fields > 0) {
        keyLen = mp.nullableBin();
        keyOff = mp.start;
      }
      if (fields > 1) {
        valueLen = mp.nullableBin();
        valueOff = mp.start;
      }
      if (fields > 2) {
        // A map of text, or Kafka's headers: an array of [key str, value bin] pairs.
        boolean kafka = mp.atArray();
        pairs = kafka ? mp.arrayLen() : mp.mapLen();
        for (int i = 0; i < 4 * pairs; i += 2) {
          if (i + 1 >= headers.length) { // grown as pairs are read: a count is only a claim
            headers = Arrays.copyOf(headers, 2 * headers.length);
          }
          if (kafka && i % 4 == 0 && mp.arrayLen() != 2) {
            throw Msgpack.MALFORMED;
          }
          headers[i + 1] = kafka && i % 4 == 2 ? mp.bin() : mp.str();
          headers[i] = mp.start;
        }
      }
      if (fields > 3) {
        millis = mp.int64(); // past int64 has no column: a raw row, as the node's page makes
      }
      if (fields > 4 && !mp.nil()) {
        mp.str();
      }
      if (fields > 5) {
        mp.integer();
      }
      for (int i = 6; i < fields; i++) {
        mp.skip(0);
      }
      if (mp.at != end) {
        throw Msgpack.MALFORMED; // trailing bytes
      }
    } catch (Msgpack.Malformed e) {
      rawRow(b, from, end);
      keepHeadersSmall();
      return;
    }
    ColumnsBuilder.binary(cols.keyOffsets, cols.keyData, cols.keyValid, b, keyOff, keyLen);
    ColumnsBuilder.binary(
        cols.valueOffsets, cols.valueData, cols.valueValid, b, valueOff, valueLen);
    for (int i = 0; i < 4 * pairs; i += 4) {
      cols.header(b, headers[i], headers[i + 1], headers[i + 2], headers[i + 3]);
    }
    cols.endRow(millis);
    keepHeadersSmall();
  }

  /** One record with many headers does not hold their memory for the rest of the read. */
  private void keepHeadersSmall() {
    if (headers.length > MAX_KEPT_HEADERS) {
      headers = new int[16];
    }
  }

  private void rawRow(byte[] b, int from, int end) {
    ColumnsBuilder.binary(cols.keyOffsets, cols.keyData, cols.keyValid, b, 0, -1);
    ColumnsBuilder.binary(cols.valueOffsets, cols.valueData, cols.valueValid, b, from, end - from);
    cols.header(RAW_HEADER, 0, 11, 11, 4);
    cols.endRow(0);
  }

  private static int le32(byte[] b, int at) {
    return (b[at] & 0xff) | (b[at + 1] & 0xff) << 8 | (b[at + 2] & 0xff) << 16
        | (b[at + 3] & 0xff) << 24;
  }

  private static long le64(byte[] b, int at) {
    return Integer.toUnsignedLong(le32(b, at)) | (long) le32(b, at + 4) << 32;
  }
}
