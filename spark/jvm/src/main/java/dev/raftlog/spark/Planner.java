package dev.raftlog.spark;

import java.util.ArrayList;
import java.util.List;
import java.util.TreeMap;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Planning on the driver, as the Python source plans a batch read of the log: per raftlog
 * partition an index range at or below the high-water mark the replicas reported, cut into
 * splits of at most {@code maxRecordsPerSplit} indexes.
 */
final class Planner {
  private static final Logger LOG = LoggerFactory.getLogger("raftlog.spark");

  private Planner() {}

  static List<LogSplit> plan(JvmOptions opts) {
    TreeMap<Integer, PartitionView> views = Survey.run(new Nodes(opts), opts);
    checkJsonPartitions("startingOffsets", opts.starting, views);
    checkJsonPartitions("endingOffsets", opts.ending, views);
    List<LogSplit> out = new ArrayList<>();
    for (PartitionView pv : views.values()) {
      int p = pv.partition;
      long hwm = pv.highWaterMark();
      long start = opts.starting.resolve(p, pv.earliest(), hwm, pv.earliest());
      long stop = opts.ending.resolve(p, pv.earliest(), hwm, hwm + 1);
      if (stop > hwm + 1) {
        throw new OptionException(
            "endingOffsets",
            "partition " + p + ": " + stop + " is past the high-water mark " + hwm
                + " (+1); only committed records can be read");
      }
      if (start > stop) {
        throw new OptionException(
            "startingOffsets", "partition " + p + ": " + start + " is after the ending offset "
                + stop);
      }
      start = startOrSkip(opts, pv, start);
      for (long lo = start; lo < stop; lo += opts.maxRecordsPerSplit) {
        long hi = Math.min(stop, lo + opts.maxRecordsPerSplit);
        out.add(new LogSplit(p, lo, hi, pv.order(opts.preferFollowers, hi, out.size())));
      }
    }
    return out;
  }

  private static void checkJsonPartitions(
      String name, Offsets spec, TreeMap<Integer, PartitionView> views) {
    if (spec.perPartition == null) {
      return;
    }
    for (int p : spec.perPartition.keySet()) {
      if (!views.containsKey(p)) {
        throw new OptionException(
            name, "partition " + p + " is not read (the partitions read are "
                + views.keySet() + ")");
      }
    }
  }

  /** {@code start}, or the earliest index still held when it was compacted and
   * failOnDataLoss=false (DataLossException otherwise). */
  private static long startOrSkip(JvmOptions opts, PartitionView pv, long start) {
    long earliest = pv.earliest();
    if (start >= earliest) {
      return start;
    }
    if (opts.failOnDataLoss) {
      throw new DataLossException(pv.partition, start, earliest, "the starting offset");
    }
    LOG.warn(
        "raftlog partition {}: skipped records [{}, {}): compacted before they were read "
            + "(failOnDataLoss=false)", pv.partition, start, earliest);
    return earliest;
  }
}
