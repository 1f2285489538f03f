package dev.raftlog.spark.vectors;

import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarMap;

/**
 * map&lt;string, string&gt; per row: the row's header pairs are [o[i], o[i+1]) of the key and
 * value string columns (int32 offsets, rows + 1), never null (no headers: an empty map).
 */
public final class HeadersVector extends ReadOnlyVector {
  private final byte[] buf;
  private final int offsets;
  private final ColumnVector keys;
  private final ColumnVector values;

  public HeadersVector(byte[] buf, int offsets, ColumnVector keys, ColumnVector values) {
    super(DataTypes.createMapType(DataTypes.StringType, DataTypes.StringType, false));
    this.buf = buf;
    this.offsets = offsets;
    this.keys = keys;
    this.values = values;
  }

  @Override
  public ColumnarMap getMap(int rowId) {
    int from = (int) INT.get(buf, offsets + 4 * rowId);
    int to = (int) INT.get(buf, offsets + 4 * (rowId + 1));
    return new ColumnarMap(keys, values, from, to - from);
  }

  @Override
  public ColumnVector getChild(int ordinal) {
    return ordinal == 0 ? keys : values;
  }
}
