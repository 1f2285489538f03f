package dev.raftlog.spark;

import java.util.Map;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * A batch read of the log: options checked when the scan is built, the ranges fixed when Spark
 * plans its partitions (a survey of the nodes), each split read in columns.
 */
final class RaftlogScan implements ScanBuilder, Scan, Batch {
  private final Map<String, String> options;
  private JvmOptions parsed;

  RaftlogScan(Map<String, String> options) {
    this.options = options;
  }

  @Override
  public Scan build() {
    parsed = JvmOptions.parse(options);
    return this;
  }

  @Override
  public StructType readSchema() {
    return Schema.SCHEMA;
  }

  @Override
  public String description() {
    return "raftlog-jvm " + String.join(",", parsed.endpoints);
  }

  @Override
  public Batch toBatch() {
    return this;
  }

  @Override
  public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
    throw new UnsupportedOperationException(
        "raftlog-jvm reads batches (spark.read) only; for a stream use format raftlog "
            + "(spark.readStream.format(\"raftlog\"))");
  }

  @Override
  public InputPartition[] planInputPartitions() {
    return Planner.plan(parsed).toArray(InputPartition[]::new);
  }

  @Override
  public PartitionReaderFactory createReaderFactory() {
    return new ReaderFactory(parsed);
  }

  /** Columnar reads only: every split is a LogSplit. */
  static final class ReaderFactory implements PartitionReaderFactory {
    private static final long serialVersionUID = 1L;
    private final JvmOptions opts;

    ReaderFactory(JvmOptions opts) {
      this.opts = opts;
    }

    @Override
    public boolean supportColumnarReads(InputPartition partition) {
      return true;
    }

    @Override
    public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
      return new LogReader(opts, (LogSplit) partition);
    }

    @Override
    public PartitionReader<InternalRow> createReader(InputPartition partition) {
      throw new UnsupportedOperationException("raftlog-jvm reads columns only");
    }
  }
}
