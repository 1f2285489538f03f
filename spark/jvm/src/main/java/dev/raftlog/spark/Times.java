package dev.raftlog.spark;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A time (ms since the epoch) for every partition ({@code startingTimestamp}) or per partition
 * ({@code startingOffsetsByTimestamp}), turned into offsets at planning by asking the replicas
 * for the first index stamped at or after it: the Python source's {@code _at_times}.
 */
final class Times implements Serializable {
  private static final long serialVersionUID = 1L;
  private static final Logger LOG = LoggerFactory.getLogger("raftlog.spark");
  final String option; // the option it came from, named in errors
  final Long all; // null: per partition
  final TreeMap<Integer, Long> perPartition;

  private Times(String option, Long all, TreeMap<Integer, Long> perPartition) {
    this.option = option;
    this.all = all;
    this.perPartition = perPartition;
  }

  /** {@code one} or {@code per}, never with each other nor with {@code offsets}; null: none. */
  static Times parse(Map<String, String> o, String one, String per, String offsets) {
    List<String> given = new ArrayList<>();
    for (String name : new String[] {offsets, per, one}) {
      if (o.containsKey(name.toLowerCase(java.util.Locale.ROOT))) {
        given.add(name);
      }
    }
    if (given.size() > 1) {
      throw new OptionException(
          given.get(given.size() - 1), "give one of " + String.join(", ", given) + ", not both");
    }
    String raw = o.get(one.toLowerCase(java.util.Locale.ROOT));
    if (raw != null) {
      String text = raw.strip();
      if (text.isEmpty() || !text.chars().allMatch(Character::isDigit)) {
        throw new OptionException(one, "must be milliseconds since the epoch, got '" + text + "'");
      }
      try {
        return new Times(one, Long.parseLong(text), null);
      } catch (NumberFormatException e) {
        throw new OptionException(one, "must be milliseconds since the epoch, got '" + text + "'");
      }
    }
    raw = o.get(per.toLowerCase(java.util.Locale.ROOT));
    if (raw == null) {
      return null;
    }
    TreeMap<Integer, Long> out = new TreeMap<>();
    TreeMap<Integer, JsonNode> parsed =
        Offsets.perPartition(
            per, raw, "a JSON object like {\"0\": 1700000000000}", "time in ms");
    for (Map.Entry<Integer, JsonNode> kv : parsed.entrySet()) {
      int p = kv.getKey();
      JsonNode v = kv.getValue();
      if (!v.isIntegralNumber() || !v.canConvertToLong() || v.longValue() < 0) {
        throw new OptionException(
            per, "the time of partition " + p + " must be milliseconds since the epoch, got " + v);
      }
      out.put(p, v.longValue());
    }
    return new Times(per, null, out);
  }

  /**
   * The offsets of these times: per partition, the first index stamped at or after its time.
   * A time no record reaches ends at the latest offset; it starts there only with
   * {@code latest} (startingOffsetsByTimestampStrategy=latest), else it is an error.
   */
  Offsets resolve(
      Nodes nodes, TreeMap<Integer, PartitionView> views, boolean ending, boolean latest,
      boolean streaming) {
    TreeMap<Integer, Long> per = new TreeMap<>();
    if (all != null) {
      views.keySet().forEach(p -> per.put(p, all));
    } else {
      per.putAll(perPartition);
    }
    for (int p : per.keySet()) {
      if (!views.containsKey(p)) {
        throw new OptionException(
            option, "partition " + p + " is not read (the partitions read are "
                + views.keySet() + ")");
      }
    }
    TreeMap<Integer, Long> out = new TreeMap<>();
    for (Map.Entry<Integer, Long> e : per.entrySet()) {
      PartitionView pv = views.get(e.getKey());
      Long index = indexForTime(nodes, pv, e.getValue());
      long latestOffset = pv.highWaterMark() + 1; // what the survey saw
      if (index == null && !(ending || latest)) {
        throw new OptionException(
            option,
            "partition " + pv.partition + " has no record stamped at or after " + e.getValue()
                + " (up to its high-water mark " + pv.highWaterMark() + "); set "
                + "startingOffsetsByTimestampStrategy=latest to start such partitions at the "
                + "latest offset");
      }
      // A batch stays at or below the planned mark; a stream's start need not (records
      // committed since the survey are after it).
      out.put(
          pv.partition,
          index == null
              ? latestOffset
              : streaming && !ending ? index : Math.min(index, latestOffset));
    }
    return Offsets.of(out);
  }

  /** Asked of the replica holding the most first (the lowest compaction floor: it answers
   * from its own log, not the archive's), never of one whose mark is below the planned one (it
   * answers 503 behind): the Python source's order. */
  private Long indexForTime(Nodes nodes, PartitionView pv, long t) {
    NodeException last = null;
    List<PartitionView.Replica> replicas = new ArrayList<>(pv.replicas);
    replicas.sort(
        Comparator.comparingLong(PartitionView.Replica::compactionFloor)
            .thenComparing(Comparator.comparingLong(PartitionView.Replica::highWaterMark)
                .reversed()));
    String path =
        "/v1/partitions/" + pv.partition + "/index-for-time?timestamp_ms=" + t + "&min_index="
            + pv.highWaterMark();
    for (PartitionView.Replica r : replicas) {
      JsonNode answer;
      try {
        answer = nodes.json(r.url(), path, nodes.timeoutS());
      } catch (NodeException e) {
        if (!e.retryable()) {
          throw new OptionException(
              option, "partition " + pv.partition + ": " + e.getMessage());
        }
        last = e;
        continue;
      }
      JsonNode index = answer.path("index");
      Long first = index.isNull() || index.isMissingNode() ? null : index.asLong();
      if (answer.path("compacted").asBoolean(false)) {
        LOG.warn(
            "raftlog partition {}: records stamped at or after {} may have been compacted; {} "
                + "is the first one still held", pv.partition, t, first == null ? "none" : first);
      }
      return first;
    }
    throw new OptionException(
        option, "partition " + pv.partition + ": no replica answered (" + last.getMessage() + ")");
  }
}
