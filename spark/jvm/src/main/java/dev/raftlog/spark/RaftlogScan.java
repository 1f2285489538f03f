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
 * A read of the log: a batch (options checked as a batch's, the ranges fixed when Spark plans its
 * partitions from a survey of the nodes) or a stream ({@link LogStream}); each split read in
 * columns.
 */
final class RaftlogScan implements ScanBuilder, Scan, Batch {
  private final Map<String, String> options;
  private JvmOptions parsed;

  RaftlogScan(Map<String, String> options) {
    this.options = options;
  }

  @Override
  public Scan build() {
    return this; // the options are checked as a batch's or a stream's, once Spark says which
  }

  @Override
  public StructType readSchema() {
    return Schema.schema(JvmOptions.includeHeaders(options));
  }

  @Override
  public String description() {
    return "raftlog-jvm[" + options.entrySet().stream()
        .filter(e -> e.getKey().equalsIgnoreCase("endpoints"))
        .map(Map.Entry::getValue).findFirst().orElse("") + "]";
  }

  @Override
  public Batch toBatch() {
    parsed = JvmOptions.parse(options, false);
    return this;
  }

  @Override
  public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
    return new LogStream(JvmOptions.parse(options, true));
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
