package dev.raftlog.spark;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.Serializable;
import java.util.Map;
import java.util.TreeMap;

/**
 * A position per partition, as Spark's Kafka source spells it: {@code earliest}, {@code latest},
 * or JSON such as {@code {"0": 120, "1": -2}} where a number is the next log index to read (a
 * start inclusive, an end exclusive), -2 earliest and -1 latest.
 */
final class Offsets implements Serializable {
  private static final long serialVersionUID = 1L;
  static final long EARLIEST = -2;
  static final long LATEST = -1;
  private static final ObjectMapper JSON = new ObjectMapper();

  /** EARLIEST or LATEST for every partition, when {@code perPartition} is null. */
  final long all;
  /** The JSON's positions; partitions missing from it take the caller's default. */
  final TreeMap<Integer, Long> perPartition;

  private Offsets(long all, TreeMap<Integer, Long> perPartition) {
    this.all = all;
    this.perPartition = perPartition;
  }

  /** A position per partition, as JSON gives them. */
  static Offsets of(TreeMap<Integer, Long> perPartition) {
    return new Offsets(0, perPartition);
  }

  static final Offsets EARLIEST_ALL = new Offsets(EARLIEST, null);
  static final Offsets LATEST_ALL = new Offsets(LATEST, null);

  static Offsets parse(String name, String raw, Offsets dflt, boolean ending) {
    if (raw == null) {
      return dflt;
    }
    String text = raw.strip();
    if (text.equalsIgnoreCase("earliest")) {
      if (ending) {
        throw new OptionException(
            name, "an ending offset cannot be earliest (use latest or JSON)");
      }
      return EARLIEST_ALL;
    }
    if (text.equalsIgnoreCase("latest")) {
      return LATEST_ALL;
    }
    TreeMap<Integer, Long> out = new TreeMap<>();
    TreeMap<Integer, JsonNode> parsed =
        perPartition(
            name, text, "earliest, latest or a JSON object like {\"0\": 42}",
            "index, like {\"0\": 42}");
    for (Map.Entry<Integer, JsonNode> kv : parsed.entrySet()) {
      int p = kv.getKey();
      JsonNode v = kv.getValue();
      if (!v.isIntegralNumber() || !v.canConvertToLong()) {
        throw new OptionException(
            name, "the offset of partition " + p + " must be an integer, got " + v);
      }
      long index = v.longValue();
      if (index < EARLIEST || index == 0) {
        throw new OptionException(
            name,
            "the offset of partition " + p + " must be a log index >= 1, -2 (earliest) "
                + "or -1 (latest), got " + index);
      }
      if (ending && index == EARLIEST) {
        throw new OptionException(
            name, "the ending offset of partition " + p + " cannot be -2 (earliest)");
      }
      out.put(p, index);
    }
    return new Offsets(0, out);
  }

  /**
   * A non-empty JSON object of partition -> value ({@code what}), its keys checked;
   * OptionException naming {@code name} otherwise ({@code like}: the example it shows).
   */
  static TreeMap<Integer, JsonNode> perPartition(
      String name, String raw, String like, String what) {
    JsonNode parsed;
    try {
      parsed = JSON.readTree(raw);
    } catch (JsonProcessingException e) {
      throw new OptionException(name, "must be " + like + ": " + e.getOriginalMessage());
    }
    if (parsed == null || !parsed.isObject() || parsed.isEmpty()) {
      throw new OptionException(
          name, "must be a non-empty JSON object of partition -> " + what);
    }
    TreeMap<Integer, JsonNode> out = new TreeMap<>();
    for (Map.Entry<String, JsonNode> kv : parsed.properties()) {
      int p;
      try {
        p = Integer.parseInt(kv.getKey().strip());
      } catch (NumberFormatException e) {
        throw new OptionException(name, "partition '" + kv.getKey() + "' is not an integer");
      }
      if (p < 0) {
        throw new OptionException(name, "partition " + p + " is negative");
      }
      out.put(p, kv.getValue());
    }
    return out;
  }

  /** The next index to read of a partition whose replicas hold [earliest, hwm]. */
  long resolve(int partition, long earliest, long hwm, long dflt) {
    long v = perPartition == null ? all : perPartition.getOrDefault(partition, dflt);
    if (v == EARLIEST) {
      return earliest;
    }
    if (v == LATEST) {
      return hwm + 1;
    }
    return v;
  }
}
