package dev.raftlog.spark;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.TreeMap;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.streaming.CompositeReadLimit;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.ReadMaxRows;
import org.apache.spark.sql.connector.read.streaming.ReadMinRows;
import org.apache.spark.sql.connector.read.streaming.ReportsSourceMetrics;
import org.apache.spark.sql.connector.read.streaming.SupportsTriggerAvailableNow;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * {@code spark.readStream.format("raftlog-jvm")}: micro-batches of committed records, planned as
 * the Python source plans them (same offsets, checkpoint format, limits and retention holds), each
 * split read in columns by {@link LogReader}. Kafka's admission control: maxOffsetsPerTrigger,
 * minOffsetsPerTrigger with maxTriggerDelay, Trigger.AvailableNow; its progress metrics
 * (offsets behind latest).
 */
final class LogStream
    implements MicroBatchStream, SupportsTriggerAvailableNow, ReportsSourceMetrics {
  private static final Logger LOG = LoggerFactory.getLogger("raftlog.spark");
  private final JvmOptions opts;
  private TreeMap<Integer, PartitionView> view;
  private TreeMap<Integer, Long> target; // Trigger.AvailableNow's end; null otherwise
  private TreeMap<Integer, Long> latest; // every partition's high-water mark + 1, last seen
  private long lastBatchAtMs = Long.MIN_VALUE / 2; // the first batch never waits
  private Map<Integer, Long> held = new HashMap<>();
  private long holdPlacedAtMs = Long.MIN_VALUE / 2;
  // The hold is renewed between triggers too: a micro-batch longer than its TTL (a first batch
  // from the earliest record, an AvailableNow backfill, an hourly trigger) would otherwise let
  // compaction pass what it has not read yet.
  private ScheduledExecutorService renewer;

  LogStream(JvmOptions opts) {
    this.opts = opts;
  }

  private synchronized void startRenewing() {
    if (renewer != null || opts.retentionHold == null) {
      return;
    }
    renewer =
        Executors.newSingleThreadScheduledExecutor(
            r -> {
              Thread t = new Thread(r, "raftlog-hold-" + opts.retentionHold);
              t.setDaemon(true);
              return t;
            });
    long every = Math.max(1, (long) (opts.retentionHoldTtlS * 1000 / 4));
    renewer.scheduleWithFixedDelay(
        () -> {
          try {
            hold(Map.of()); // placed again once a quarter of the TTL has passed
          } catch (RuntimeException e) { // a refusal: the next trigger's hold raises it too
            LOG.error("retention hold {} not renewed: {}", opts.retentionHold, e.getMessage());
          }
        },
        every,
        every,
        TimeUnit.MILLISECONDS);
  }

  private TreeMap<Integer, PartitionView> survey() {
    view = Survey.run(new Nodes(opts), opts);
    latest = new TreeMap<>();
    view.forEach((p, pv) -> latest.put(p, pv.highWaterMark() + 1));
    return view;
  }

  @Override
  public Offset initialOffset() {
    TreeMap<Integer, PartitionView> views = survey();
    Offsets starting =
        opts.startingTimes == null
            ? opts.starting
            : opts.startingTimes.resolve(
                new Nodes(opts), views, false, opts.noMatchLatest, true);
    Planner.checkJsonPartitions("startingOffsets", starting, views);
    Map<Integer, Long> start = new TreeMap<>();
    views.forEach(
        (p, pv) ->
            start.put(
                p,
                starting.resolve(p, pv.earliest(), pv.highWaterMark(), pv.highWaterMark() + 1)));
    hold(start);
    return new LogOffset(start);
  }

  @Override
  public Offset deserializeOffset(String json) {
    return LogOffset.parse(json);
  }

  @Override
  public ReadLimit getDefaultReadLimit() {
    List<ReadLimit> limits = new ArrayList<>();
    if (opts.minOffsetsPerTrigger > 0) {
      limits.add(
          ReadLimit.minRows(opts.minOffsetsPerTrigger, (long) (opts.maxTriggerDelayS * 1000)));
    }
    if (opts.maxOffsetsPerTrigger > 0) {
      limits.add(ReadLimit.maxRows(opts.maxOffsetsPerTrigger));
    }
    return switch (limits.size()) {
      case 0 -> ReadLimit.allAvailable();
      case 1 -> limits.get(0);
      default -> ReadLimit.compositeLimit(limits.toArray(ReadLimit[]::new));
    };
  }

  @Override
  public void prepareForTriggerAvailableNow() {
    target = new TreeMap<>(survey().entrySet().stream()
        .collect(java.util.stream.Collectors.toMap(
            Map.Entry::getKey, e -> e.getValue().highWaterMark() + 1)));
  }

  @Override
  public Offset latestOffset() {
    throw new UnsupportedOperationException("latestOffset(start, limit) is used");
  }

  @Override
  public Offset latestOffset(Offset startOffset, ReadLimit limit) {
    TreeMap<Integer, PartitionView> views = survey();
    TreeMap<Integer, Long> begin = new TreeMap<>(((LogOffset) startOffset).next);
    TreeMap<Integer, Long> end = new TreeMap<>();
    for (Map.Entry<Integer, PartitionView> e : views.entrySet()) {
      int p = e.getKey();
      long v = e.getValue().highWaterMark() + 1;
      if (target != null && target.containsKey(p)) {
        v = Math.min(v, target.get(p));
      }
      // A partition new to the query starts at its earliest record (as Kafka's source does).
      begin.putIfAbsent(p, e.getValue().earliest());
      end.put(p, Math.max(v, begin.get(p)));
    }
    // A partition this survey missed (its only members silent) stays where it is: left out of
    // the offset, the next trigger took it for new and read it again from its earliest record.
    for (Map.Entry<Integer, Long> e : begin.entrySet()) {
      end.putIfAbsent(e.getKey(), e.getValue());
    }
    // As the Python source: the hold moves up to where the previous batch ended (committed).
    hold(begin);
    ReadMinRows least = null;
    ReadMaxRows most = null;
    ReadLimit[] parts =
        limit instanceof CompositeReadLimit c ? c.getReadLimits() : new ReadLimit[] {limit};
    for (ReadLimit l : parts) {
      if (l instanceof ReadMinRows m) {
        least = m;
      } else if (l instanceof ReadMaxRows m) {
        most = m;
      }
    }
    long available = 0;
    for (Map.Entry<Integer, Long> e : end.entrySet()) {
      available += e.getValue() - begin.get(e.getKey());
    }
    long now = System.currentTimeMillis();
    if (least != null && target == null && available < least.minRows()
        && now - lastBatchAtMs < least.maxTriggerDelayMs()) {
      return startOffset; // too few records yet: no batch this trigger
    }
    if (most != null && available > most.maxRows()) {
      end = allot(begin, end, most.maxRows());
    }
    if (available > 0) {
      lastBatchAtMs = now;
    }
    return new LogOffset(end);
  }

  /** {@code end} cut back so that at most {@code budget} records are read, shared in proportion
   * to what each partition has available (the Python source's {@code allot}). */
  static TreeMap<Integer, Long> allot(
      Map<Integer, Long> start, TreeMap<Integer, Long> end, long budget) {
    TreeMap<Integer, Long> avail = new TreeMap<>();
    long total = 0;
    for (Map.Entry<Integer, Long> e : end.entrySet()) {
      long a = Math.max(0, e.getValue() - start.getOrDefault(e.getKey(), e.getValue()));
      avail.put(e.getKey(), a);
      total += a;
    }
    if (total <= budget) {
      return end;
    }
    TreeMap<Integer, Long> take = new TreeMap<>();
    long left = budget;
    for (Map.Entry<Integer, Long> e : avail.entrySet()) {
      long t = java.math.BigInteger.valueOf(e.getValue())
          .multiply(java.math.BigInteger.valueOf(budget))
          .divide(java.math.BigInteger.valueOf(total)).longValue();
      take.put(e.getKey(), t);
      left -= t;
    }
    for (Map.Entry<Integer, Long> e : avail.entrySet()) {
      if (left <= 0) {
        break;
      }
      if (take.get(e.getKey()) < e.getValue()) {
        take.merge(e.getKey(), 1L, Long::sum);
        left--;
      }
    }
    TreeMap<Integer, Long> out = new TreeMap<>();
    for (int p : end.keySet()) {
      out.put(p, start.getOrDefault(p, end.get(p)) + take.get(p));
    }
    return out;
  }

  @Override
  public Offset reportLatestOffset() {
    return latest == null ? null : new LogOffset(latest);
  }

  @Override
  public InputPartition[] planInputPartitions(Offset start, Offset end) {
    TreeMap<Integer, PartitionView> views = view != null ? view : survey();
    Map<Integer, Long> begin = ((LogOffset) start).next;
    List<LogSplit> out = new ArrayList<>();
    for (Map.Entry<Integer, Long> e : ((LogOffset) end).next.entrySet()) {
      int p = e.getKey();
      long hi = e.getValue();
      PartitionView pv = views.get(p);
      if (pv == null) {
        continue;
      }
      long lo = begin.getOrDefault(p, pv.earliest());
      if (hi <= lo) {
        continue;
      }
      lo = Planner.startOrSkip(opts, pv, lo, "the checkpointed offset");
      if (lo < hi) {
        Planner.addSplits(opts, pv, lo, hi, out);
      }
    }
    return Planner.spread(out, opts.minPartitions).toArray(InputPartition[]::new);
  }

  @Override
  public PartitionReaderFactory createReaderFactory() {
    return new RaftlogScan.ReaderFactory(opts);
  }

  @Override
  public void commit(Offset end) {
    hold(((LogOffset) end).next);
  }

  @Override
  public synchronized void stop() {
    if (renewer != null) {
      renewer.shutdownNow();
    }
  }

  /** Kafka's progress metrics: how far the records read trail each partition's latest. */
  @Override
  public Map<String, String> metrics(Optional<Offset> latestConsumed) {
    Map<String, String> out = new HashMap<>();
    if (latestConsumed.isEmpty() || latest == null) {
      return out;
    }
    Map<Integer, Long> read = ((LogOffset) latestConsumed.get()).next;
    long min = Long.MAX_VALUE;
    long max = 0;
    double sum = 0;
    for (Map.Entry<Integer, Long> e : latest.entrySet()) {
      long behind = Math.max(0, e.getValue() - read.getOrDefault(e.getKey(), e.getValue()));
      min = Math.min(min, behind);
      max = Math.max(max, behind);
      sum += behind;
    }
    if (latest.isEmpty()) {
      return out;
    }
    out.put("minOffsetsBehindLatest", Long.toString(min));
    out.put("maxOffsetsBehindLatest", Long.toString(max));
    out.put("avgOffsetsBehindLatest", Double.toString(sum / latest.size()));
    return out;
  }

  /**
   * Moves the retention hold up to {@code offsets} on every replica (never down), or renews it
   * once a quarter of its TTL has passed: the Python source's holds. A refusal (token, request)
   * stops the stream; a replica out of reach is logged and asked again at the next move.
   */
  private synchronized void hold(Map<Integer, Long> offsets) {
    String holder = opts.retentionHold;
    if (holder == null) {
      return;
    }
    startRenewing();
    Map<Integer, Long> merged = new HashMap<>(held);
    offsets.forEach((p, i) -> merged.merge(p, i, Math::max));
    long now = System.currentTimeMillis();
    boolean fresh = now - holdPlacedAtMs < opts.retentionHoldTtlS * 1000 / 4;
    if (merged.equals(held) && fresh) {
      return;
    }
    TreeMap<Integer, PartitionView> views = view != null ? view : survey();
    Nodes nodes = new Nodes(opts);
    for (Map.Entry<Integer, Long> e : new TreeMap<>(merged).entrySet()) {
      PartitionView pv = views.get(e.getKey());
      for (PartitionView.Replica r : pv == null ? List.<PartitionView.Replica>of() : pv.replicas) {
        try {
          nodes.setHold(r.url(), e.getKey(), holder, e.getValue(), opts.retentionHoldTtlS);
        } catch (NodeException ex) {
          if (!ex.retryable() && ex.status != 410) {
            throw new IllegalStateException(
                "raftlog option 'retentionHold': the hold '" + holder + "' on partition "
                    + e.getKey() + " was refused: " + ex.getMessage());
          }
          LOG.warn("retention hold {} on partition {}: {}", holder, e.getKey(), ex.getMessage());
        }
      }
    }
    // Only once no replica refused it: a refusal taken for placed (by the renewal thread,
    // which can only log it) was never raised, and the stream ran on without its hold.
    held = merged;
    holdPlacedAtMs = now;
  }

  @Override
  public String toString() {
    return "raftlog-jvm[" + String.join(",", opts.endpoints) + "]";
  }
}
