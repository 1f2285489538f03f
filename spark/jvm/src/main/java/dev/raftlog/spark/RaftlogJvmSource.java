package dev.raftlog.spark;

import java.util.EnumSet;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * {@code spark.read.format("raftlog-jvm")} and {@code spark.readStream.format("raftlog-jvm")}:
 * reads of a raftlog cluster's committed log (mode=log), planned and read in the JVM with the
 * options, offsets and checkpoints of the Python source ({@code raftlog}).
 */
public final class RaftlogJvmSource implements TableProvider, DataSourceRegister {
  @Override
  public String shortName() {
    return "raftlog-jvm";
  }

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    return Schema.schema(JvmOptions.includeHeaders(options.asCaseSensitiveMap()));
  }

  @Override
  public Table getTable(
      StructType schema, Transform[] partitioning, Map<String, String> properties) {
    return new LogTable(schema);
  }

  static final class LogTable implements SupportsRead {
    private final StructType schema;

    LogTable(StructType schema) {
      this.schema = schema;
    }

    @Override
    public String name() {
      return "raftlog-jvm";
    }

    @Override
    @SuppressWarnings("deprecation")
    public StructType schema() {
      return schema;
    }

    @Override
    public Set<TableCapability> capabilities() {
      return EnumSet.of(TableCapability.BATCH_READ, TableCapability.MICRO_BATCH_READ);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
      return new RaftlogScan(options.asCaseSensitiveMap());
    }
  }
}
