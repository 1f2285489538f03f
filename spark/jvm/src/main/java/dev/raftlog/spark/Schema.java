package dev.raftlog.spark;

import dev.raftlog.spark.vectors.BytesVector;
import dev.raftlog.spark.vectors.ConstantIntVector;
import dev.raftlog.spark.vectors.HeaderPairsVector;
import dev.raftlog.spark.vectors.HeadersVector;
import dev.raftlog.spark.vectors.Int64Vector;
import dev.raftlog.spark.vectors.TimestampVector;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * The schema of {@code raftlog.spark.arrow.SCHEMA} (with includeHeaders=true, that of {@code
 * KAFKA_SCHEMA}: Kafka's headers type in the same place), and a page's rows as a batch of it.
 */
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

  static StructType schema(boolean includeHeaders) {
    if (!includeHeaders) {
      return SCHEMA;
    }
    StructField[] fields = SCHEMA.fields().clone();
    for (int i = 0; i < fields.length; i++) {
      if (fields[i].name().equals("headers")) {
        fields[i] = DataTypes.createStructField("headers", HeaderPairsVector.TYPE, true);
      }
    }
    return new StructType(fields);
  }

  /** The page's columns, read in place. */
  static ColumnarBatch batch(Page page, boolean includeHeaders) {
    int n = (int) page.count;
    Page.Span hk = page.headerKeyOffsets;
    Page.Span hv = page.headerValueOffsets;
    ColumnVector[] columns = {
      new ConstantIntVector((int) page.partition),
      new Int64Vector(page.index.buf, page.index.offset),
      new Int64Vector(page.term.buf, page.term.offset),
      binary(page.keyOffsets, page.keyData, page.keyValid, n),
      binary(page.valueOffsets, page.valueData, page.valueValid, n),
      includeHeaders
          ? new HeaderPairsVector(
              page.headerOffsets.buf,
              page.headerOffsets.offset,
              BytesVector.strings(
                  hk.buf, hk.offset, page.headerKeyData.buf, page.headerKeyData.offset),
              BytesVector.binary(
                  hv.buf, hv.offset, page.headerValueData.buf, page.headerValueData.offset))
          : new HeadersVector(
              page.headerOffsets.buf,
              page.headerOffsets.offset,
              BytesVector.strings(
                  hk.buf, hk.offset, page.headerKeyData.buf, page.headerKeyData.offset),
              BytesVector.strings(
                  hv.buf, hv.offset, page.headerValueData.buf, page.headerValueData.offset)),
      new TimestampVector(page.timestampMs.buf, page.timestampMs.offset, n),
    };
    return new ColumnarBatch(columns, n);
  }

  private static BytesVector binary(Page.Span offsets, Page.Span data, Page.Span valid, int n) {
    return BytesVector.binary(
        offsets.buf, offsets.offset, data.buf, data.offset, valid.buf, valid.offset, n);
  }
}
