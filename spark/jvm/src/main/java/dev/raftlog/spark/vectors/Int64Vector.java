package dev.raftlog.spark.vectors;

import org.apache.spark.sql.types.DataTypes;

/** A little-endian int64 per row, with no nulls (index, term). */
public final class Int64Vector extends ReadOnlyVector {
  private final byte[] buf;
  private final int offset;

  public Int64Vector(byte[] buf, int offset) {
    super(DataTypes.LongType);
    this.buf = buf;
    this.offset = offset;
  }

  @Override
  public long getLong(int rowId) {
    return (long) LONG.get(buf, offset + 8 * rowId);
  }
}
