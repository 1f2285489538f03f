package dev.raftlog.spark;

import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ThreadLocalRandom;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One Spark task: the committed records of a split, page by page, each page a batch. A page is
 * asked of the split's replicas in order, as the Python source's {@code _fetch} does: the next
 * one on no answer, a retryable status (503 {@code behind} or {@code busy}, ...) or 404
 * {@code unknown_partition}; a 410 whose floor is past the read marks that replica compacted,
 * one whose floor is not (a snapshot install under way) is retried; when every replica is
 * compacted past the read, data loss (or,
 * with failOnDataLoss=false, a logged skip to the floor). Rounds are retried with back-off for
 * up to timeoutSeconds.
 */
final class LogReader implements PartitionReader<ColumnarBatch> {
  private static final Logger LOG = LoggerFactory.getLogger("raftlog.spark");

  private final JvmOptions opts;
  private final LogSplit split;
  private final Nodes nodes;
  private long at;
  private ColumnarBatch current;
  private final Set<String> unanswered = new HashSet<>(); // replicas that gave no answer

  LogReader(JvmOptions opts, LogSplit split) {
    this.opts = opts;
    this.split = split;
    this.nodes = new Nodes(opts);
    this.at = split.start;
  }

  @Override
  public boolean next() {
    while (at < split.stop) {
      Page page = fetch();
      if (page == null) {
        continue; // skipped to the floor
      }
      at = page.next;
      if (page.count > 0) {
        current = Schema.batch(page, opts.includeHeaders);
        return true;
      }
    }
    return false;
  }

  @Override
  public ColumnarBatch get() {
    return current;
  }

  @Override
  public void close() {
    current = null;
  }

  /** The next page from {@code at}, or null after moving {@code at} past lost records. */
  private Page fetch() {
    long deadline = System.nanoTime() + (long) (opts.timeoutS * 1e9);
    Map<String, Long> floors = new LinkedHashMap<>();
    Map<String, String> errors = new LinkedHashMap<>();
    for (int attempt = 0; ; attempt++) {
      // A replica that gave no answer earlier in the split (down, or frozen until the call's
      // timeout) is asked after the others: each page cost it the whole timeoutSeconds.
      List<String> order = new ArrayList<>(List.of(split.replicas));
      order.sort(Comparator.comparing(unanswered::contains));
      for (String url : order) {
        if (floors.containsKey(url)) {
          continue;
        }
        Page page;
        try {
          page = nodes.columns(url, split.partition, at, split.stop, opts.pageRecords);
        } catch (NodeException e) {
          if (e.silent) {
            unanswered.add(url);
          }
          if (e.status == 410) {
            long floor = e.body.path("compaction_floor").asLong(at + 1);
            if (floor > at) {
              floors.put(url, floor);
            } else {
              errors.put(url, url + ": 410 with a floor of " + floor + " at " + at);
            }
            continue;
          }
          // A replica without the partition (recreated with an empty disk, not yet given its
          // partitions) is one replica's state: another may serve the page.
          if (!e.retryable() && !e.unknownPartition()) {
            throw new IllegalStateException(
                "raftlog partition " + split.partition + ": reading [" + at + ", " + split.stop
                    + ") failed: " + e.getMessage());
          }
          errors.put(url, e.getMessage());
          continue;
        }
        if (page.next > at) {
          return page;
        }
        errors.put(url, url + ": no progress at " + at);
      }
      if (floors.size() == split.replicas.length) {
        long floor = floors.values().stream().mapToLong(Long::longValue).min().getAsLong();
        if (opts.failOnDataLoss) {
          throw new DataLossException(split.partition, at, floor, "the planned index");
        }
        long skipTo = Math.min(floor, split.stop);
        LOG.warn(
            "raftlog partition {}: skipped records [{}, {}): compacted before they were read "
                + "(failOnDataLoss=false)", split.partition, at, skipTo);
        at = skipTo;
        return null;
      }
      if (System.nanoTime() >= deadline) {
        throw new IllegalStateException(
            "raftlog partition " + split.partition + ": no replica served [" + at + ", "
                + split.stop + ") within timeoutSeconds=" + opts.timeoutS + ": "
                + String.join("; ", errors.values()));
      }
      backoff(attempt);
    }
  }

  private static void backoff(int attempt) {
    double s = Math.min(1.0, 0.05 * Math.pow(2, Math.min(attempt, 20)));
    try {
      Thread.sleep((long) (s * ThreadLocalRandom.current().nextDouble(0.5, 1.0) * 1000));
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException("raftlog: a read was interrupted", e);
    }
  }
}
