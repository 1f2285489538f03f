package dev.raftlog.spark.vectors;

import java.util.Arrays;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * Byte strings laid out as Arrow's: int32 offsets (rows + 1) into the concatenated data, and,
 * when nullable, one validity byte per row (0: null). Binary (key, value) or UTF-8 strings
 * (header keys and values, read without a copy). Each buffer is at an offset of an array,
 * the same array for a column page's, one array each for a page the reader built.
 */
public final class BytesVector extends ReadOnlyVector {
  private final byte[] offsetsBuf;
  private final int offsets;
  private final byte[] dataBuf;
  private final int data;
  private final byte[] validBuf;
  private final int valid; // -1: no nulls
  private final int nulls;

  private BytesVector(
      DataType type, byte[] offsetsBuf, int offsets, byte[] dataBuf, int data, byte[] validBuf,
      int valid, int rows) {
    super(type);
    this.offsetsBuf = offsetsBuf;
    this.offsets = offsets;
    this.dataBuf = dataBuf;
    this.data = data;
    this.validBuf = validBuf;
    this.nulls = valid < 0 ? 0 : countNulls(validBuf, valid, rows);
    this.valid = nulls == 0 ? -1 : valid;
  }

  /** Nullable binary: the validity buffer at {@code valid} of {@code validBuf}. */
  public static BytesVector binary(
      byte[] offsetsBuf, int offsets, byte[] dataBuf, int data, byte[] validBuf, int valid,
      int rows) {
    return new BytesVector(
        DataTypes.BinaryType, offsetsBuf, offsets, dataBuf, data, validBuf, valid, rows);
  }

  /** Binary without nulls. */
  public static BytesVector binary(byte[] offsetsBuf, int offsets, byte[] dataBuf, int data) {
    return new BytesVector(DataTypes.BinaryType, offsetsBuf, offsets, dataBuf, data, null, -1, 0);
  }

  /** Strings without nulls. */
  public static BytesVector strings(byte[] offsetsBuf, int offsets, byte[] dataBuf, int data) {
    return new BytesVector(DataTypes.StringType, offsetsBuf, offsets, dataBuf, data, null, -1, 0);
  }

  private int start(int rowId) {
    return (int) INT.get(offsetsBuf, offsets + 4 * rowId);
  }

  @Override
  public int numNulls() {
    return nulls;
  }

  @Override
  public boolean isNullAt(int rowId) {
    return valid >= 0 && validBuf[valid + rowId] == 0;
  }

  @Override
  public byte[] getBinary(int rowId) {
    if (isNullAt(rowId)) {
      return null;
    }
    return Arrays.copyOfRange(dataBuf, data + start(rowId), data + start(rowId + 1));
  }

  @Override
  public UTF8String getUTF8String(int rowId) {
    if (isNullAt(rowId)) {
      return null;
    }
    int from = start(rowId);
    return UTF8String.fromBytes(dataBuf, data + from, start(rowId + 1) - from);
  }
}
