package dev.raftlog.spark.vectors;

import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarArray;

/**
 * Kafka's headers per row (includeHeaders=true): array&lt;struct&lt;key string, value
 * binary&gt;&gt;, the row's pairs [o[i], o[i+1]) of the key and value columns (int32 offsets,
 * rows + 1), in the record's order, never null (no headers: an empty array).
 */
public final class HeaderPairsVector extends ReadOnlyVector {
  public static final ArrayType TYPE =
      DataTypes.createArrayType(
          new StructType(
              new StructField[] {
                DataTypes.createStructField("key", DataTypes.StringType, true),
                DataTypes.createStructField("value", DataTypes.BinaryType, true),
              }),
          true);
  private final byte[] buf;
  private final int offsets;
  private final Pairs pairs;

  public HeaderPairsVector(byte[] buf, int offsets, ColumnVector keys, ColumnVector values) {
    super(TYPE);
    this.buf = buf;
    this.offsets = offsets;
    this.pairs = new Pairs(TYPE.elementType(), keys, values);
  }

  @Override
  public ColumnarArray getArray(int rowId) {
    int from = (int) INT.get(buf, offsets + 4 * rowId);
    int to = (int) INT.get(buf, offsets + 4 * (rowId + 1));
    return new ColumnarArray(pairs, from, to - from);
  }

  @Override
  public ColumnVector getChild(int ordinal) {
    return pairs;
  }

  /** The pairs as structs: Spark reads a struct's fields from its children. */
  static final class Pairs extends ReadOnlyVector {
    private final ColumnVector keys;
    private final ColumnVector values;

    Pairs(DataType type, ColumnVector keys, ColumnVector values) {
      super(type);
      this.keys = keys;
      this.values = values;
    }

    @Override
    public ColumnVector getChild(int ordinal) {
      return ordinal == 0 ? keys : values;
    }
  }
}
