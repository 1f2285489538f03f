package dev.raftlog.spark.vectors;

import org.apache.spark.sql.types.DataTypes;

/**
 * Spark timestamps (microseconds) from the page's int64 milliseconds; a record without a
 * timestamp (0) reads as null, as the Python source's.
 */
public final class TimestampVector extends ReadOnlyVector {
  private final byte[] buf;
  private final int offset;
  private final int nulls;

  public TimestampVector(byte[] buf, int offset, int rows) {
    super(DataTypes.TimestampType);
    this.buf = buf;
    this.offset = offset;
    int n = 0;
    for (int i = 0; i < rows; i++) {
      if (millis(i) == 0) {
        n++;
      }
    }
    this.nulls = n;
  }

  private long millis(int rowId) {
    return (long) LONG.get(buf, offset + 8 * rowId);
  }

  @Override
  public int numNulls() {
    return nulls;
  }

  @Override
  public boolean isNullAt(int rowId) {
    return nulls > 0 && millis(rowId) == 0;
  }

  @Override
  public long getLong(int rowId) {
    return millis(rowId) * 1000;
  }
}
