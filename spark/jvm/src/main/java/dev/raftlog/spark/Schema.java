package dev.raftlog.spark;

import dev.raftlog.spark.vectors.BytesVector;
import dev.raftlog.spark.vectors.ConstantIntVector;
import dev.raftlog.spark.vectors.HeadersVector;
import dev.raftlog.spark.vectors.Int64Vector;
import dev.raftlog.spark.vectors.TimestampVector;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/** The schema of {@code raftlog.spark.arrow.SCHEMA}, and a page's rows as a batch of it. */
final class Schema {
  private Schema() {}

  static final StructType SCHEMA =
      new StructType(
          new StructField[] {
            DataTypes.createStructField("partition", DataTypes.IntegerType, false),
            DataTypes.createStructField("index", DataTypes.LongType, true),
            DataTypes.createStructField("term", DataTypes.LongType, true),
            DataTypes.createStructField("key", DataTypes.BinaryType, true),
            DataTypes.createStructField("value", DataTypes.BinaryType, true),
            DataTypes.createStructField(
                "headers",
                DataTypes.createMapType(DataTypes.StringType, DataTypes.StringType, false),
                true),
            DataTypes.createStructField("timestamp", DataTypes.TimestampType, true),
          });

  /** The page's columns, read in place. */
  static ColumnarBatch batch(Page page) {
    byte[] b = page.buf;
    int n = (int) page.count;
    ColumnVector[] columns = {
      new ConstantIntVector((int) page.partition),
      new Int64Vector(b, page.index.offset),
      new Int64Vector(b, page.term.offset),
      BytesVector.binary(b, page.keyOffsets.offset, page.keyData.offset, page.keyValid.offset, n),
      BytesVector.binary(
          b, page.valueOffsets.offset, page.valueData.offset, page.valueValid.offset, n),
      new HeadersVector(
          b,
          page.headerOffsets.offset,
          BytesVector.strings(b, page.headerKeyOffsets.offset, page.headerKeyData.offset),
          BytesVector.strings(b, page.headerValueOffsets.offset, page.headerValueData.offset)),
      new TimestampVector(b, page.timestampMs.offset, n),
    };
    return new ColumnarBatch(columns, n);
  }
}
