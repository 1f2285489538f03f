package dev.raftlog.spark;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.util.Map;
import java.util.StringJoiner;
import java.util.TreeMap;
import org.apache.spark.sql.connector.read.streaming.Offset;

/**
 * A stream's position: the next log index to read per raftlog partition. Its JSON is the
 * Python source's (`json.dumps` of {@code {"0": 120, "1": 5}}), so that a checkpoint written by
 * one format is read by the other.
 */
final class LogOffset extends Offset {
  private static final ObjectMapper JSON = new ObjectMapper();
  final TreeMap<Integer, Long> next;

  LogOffset(Map<Integer, Long> next) {
    this.next = new TreeMap<>(next);
  }

  static LogOffset parse(String json) {
    JsonNode parsed;
    try {
      parsed = JSON.readTree(json);
    } catch (JsonProcessingException e) {
      throw new IllegalArgumentException("a raftlog offset that is not JSON: " + json, e);
    }
    if (parsed == null || !parsed.isObject()) {
      throw new IllegalArgumentException("a raftlog offset that is not a JSON object: " + json);
    }
    TreeMap<Integer, Long> next = new TreeMap<>();
    for (Map.Entry<String, JsonNode> kv : parsed.properties()) {
      next.put(Integer.parseInt(kv.getKey()), kv.getValue().asLong());
    }
    return new LogOffset(next);
  }

  @Override
  public String json() {
    StringJoiner out = new StringJoiner(", ", "{", "}");
    next.forEach((p, i) -> out.add("\"" + p + "\": " + i));
    return out.toString();
  }
}
