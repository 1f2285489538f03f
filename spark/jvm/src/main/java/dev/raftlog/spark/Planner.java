package dev.raftlog.spark;

import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.PriorityQueue;
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
    Nodes nodes = new Nodes(opts);
    TreeMap<Integer, PartitionView> views = Survey.run(nodes, opts);
    Offsets starting =
        opts.startingTimes == null
            ? opts.starting
            : opts.startingTimes.resolve(nodes, views, false, opts.noMatchLatest, false);
    Offsets ending =
        opts.endingTimes == null
            ? opts.ending
            : opts.endingTimes.resolve(nodes, views, true, true, false);
    checkJsonPartitions("startingOffsets", starting, views);
    checkJsonPartitions("endingOffsets", ending, views);
    List<LogSplit> out = new ArrayList<>();
    for (PartitionView pv : views.values()) {
      int p = pv.partition;
      long hwm = pv.highWaterMark();
      long start = starting.resolve(p, pv.earliest(), hwm, pv.earliest());
      long stop = ending.resolve(p, pv.earliest(), hwm, hwm + 1);
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
      start = startOrSkip(opts, pv, start, "the starting offset");
      addSplits(opts, pv, start, stop, out);
    }
    return spread(out, opts.minPartitions);
  }

  /** [start, stop) of one partition cut into splits of at most maxRecordsPerSplit, to `out`. */
  static void addSplits(JvmOptions opts, PartitionView pv, long start, long stop,
      List<LogSplit> out) {
    for (long lo = start; lo < stop; lo += opts.maxRecordsPerSplit) {
      long hi = Math.min(stop, lo + opts.maxRecordsPerSplit);
      out.add(new LogSplit(pv.partition, lo, hi, pv.order(opts.preferFollowers, hi, out.size())));
    }
  }

  /** {@code splits} with the largest halved until there are {@code minPartitions} of them
   * (Kafka's minPartitions), or every split holds one index; in partition and index order.
   * Of equal sizes, the lowest partition and index is halved first, as in the Python reader's
   * {@code spread}, so both readers cut the same ranges. */
  static List<LogSplit> spread(List<LogSplit> splits, int minPartitions) {
    if (splits.size() >= minPartitions) {
      return splits;
    }
    PriorityQueue<LogSplit> largest =
        new PriorityQueue<>(Comparator.comparingLong((LogSplit s) -> s.start - s.stop)
            .thenComparingInt(s -> s.partition).thenComparingLong(s -> s.start));
    largest.addAll(splits);
    while (!largest.isEmpty() && largest.size() < minPartitions
        && largest.peek().stop - largest.peek().start >= 2) {
      LogSplit s = largest.poll();
      long mid = s.start + (s.stop - s.start) / 2;
      largest.add(new LogSplit(s.partition, s.start, mid, s.replicas));
      largest.add(new LogSplit(s.partition, mid, s.stop, s.replicas));
    }
    List<LogSplit> out = new ArrayList<>(largest);
    out.sort(Comparator.comparingInt((LogSplit s) -> s.partition).thenComparingLong(s -> s.start));
    return out;
  }

  static void checkJsonPartitions(
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
  static long startOrSkip(JvmOptions opts, PartitionView pv, long start, String where) {
    long earliest = pv.earliest();
    if (start >= earliest) {
      return start;
    }
    if (opts.failOnDataLoss) {
      throw new DataLossException(pv.partition, start, earliest, where);
    }
    LOG.warn(
        "raftlog partition {}: skipped records [{}, {}): compacted before they were read "
            + "(failOnDataLoss=false)", pv.partition, start, earliest);
    return earliest;
  }
}
