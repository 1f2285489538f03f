package dev.raftlog.spark.vectors;

import java.util.Arrays;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * Byte strings laid out as Arrow's: int32 offsets (rows + 1) into the concatenated data, and,
 * when nullable, one validity byte per row (0: null). Binary (key, value) or UTF-8 strings
 * (header keys and values, read without a copy).
 */
public final class BytesVector extends ReadOnlyVector {
  private final byte[] buf;
  private final int offsets;
  private final int data;
  private final int valid; // -1: no nulls
  private final int nulls;

  private BytesVector(DataType type, byte[] buf, int offsets, int data, int valid, int rows) {
    super(type);
    this.buf = buf;
    this.offsets = offsets;
    this.data = data;
    this.nulls = valid < 0 ? 0 : countNulls(buf, valid, rows);
    this.valid = nulls == 0 ? -1 : valid;
  }

  /** Nullable binary: the validity buffer at {@code valid}. */
  public static BytesVector binary(byte[] buf, int offsets, int data, int valid, int rows) {
    return new BytesVector(DataTypes.BinaryType, buf, offsets, data, valid, rows);
  }

  /** Strings without nulls. */
  public static BytesVector strings(byte[] buf, int offsets, int data) {
    return new BytesVector(DataTypes.StringType, buf, offsets, data, -1, 0);
  }

  private int start(int rowId) {
    return (int) INT.get(buf, offsets + 4 * rowId);
  }

  @Override
  public int numNulls() {
    return nulls;
  }

  @Override
  public boolean isNullAt(int rowId) {
    return valid >= 0 && buf[valid + rowId] == 0;
  }

  @Override
  public byte[] getBinary(int rowId) {
    if (isNullAt(rowId)) {
      return null;
    }
    return Arrays.copyOfRange(buf, data + start(rowId), data + start(rowId + 1));
  }

  @Override
  public UTF8String getUTF8String(int rowId) {
    if (isNullAt(rowId)) {
      return null;
    }
    int from = start(rowId);
    return UTF8String.fromBytes(buf, data + from, start(rowId + 1) - from);
  }
}
