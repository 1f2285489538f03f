package dev.raftlog.spark;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.TreeSet;

/** Every endpoint's {@code /v1/status}, as the Python source's {@code nodes.survey}. */
final class Survey {
  private Survey() {}

  /** The partitions read, by number; OptionException naming `endpoints` when none answers. */
  static TreeMap<Integer, PartitionView> run(Nodes nodes, JvmOptions opts) {
    double timeout = Math.min(opts.timeoutS, 10.0);
    TreeMap<Integer, PartitionView> views = new TreeMap<>();
    Map<String, String> unreachable = new LinkedHashMap<>();
    TreeSet<String> clusters = new TreeSet<>();
    for (String base : opts.endpoints) {
      JsonNode st;
      try {
        st = nodes.json(base, "/v1/status", timeout);
      } catch (NodeException e) {
        unreachable.put(base, e.getMessage());
        continue;
      }
      JsonNode parts = st.path("partitions");
      if (st.hasNonNull("cluster") && !st.get("cluster").asText().isEmpty()) {
        clusters.add(st.get("cluster").asText());
      }
      for (JsonNode p : parts) {
        int n = p.get("partition").asInt();
        views
            .computeIfAbsent(n, PartitionView::new)
            .replicas
            .add(
                new PartitionView.Replica(
                    base,
                    "leader".equals(p.path("role").asText()),
                    p.get("high_water_mark").asLong(),
                    // The lowest index it serves: below its floor from the cluster's archive
                    // (tiered reads); a node without the field serves from its floor.
                    p.path("readable_from").asLong(p.get("compaction_floor").asLong()),
                    p.get("compaction_floor").asLong()));
      }
    }
    if (views.isEmpty()) {
      String why = String.join("; ", unreachable.values()); // each names its endpoint
      throw new OptionException("endpoints", "no node answered /v1/status (" + why + ")");
    }
    // Members may hold different numbers of partitions while a raise rolls through them: a
    // partition is read from those that hold it (refusing stopped every query for the raise).
    if (clusters.size() > 1) {
      throw new OptionException(
          "endpoints", "the nodes are members of different clusters " + clusters);
    }
    if (opts.partitions != null) {
      List<Integer> missing = new ArrayList<>();
      for (int p : opts.partitions) {
        if (!views.containsKey(p)) {
          missing.add(p);
        }
      }
      if (!missing.isEmpty()) {
        throw new OptionException(
            "partitions",
            missing + " do not exist (the cluster has 0.." + (views.size() - 1) + ")");
      }
      TreeMap<Integer, PartitionView> chosen = new TreeMap<>();
      Arrays.stream(opts.partitions).forEach(p -> chosen.put(p, views.get(p)));
      return chosen;
    }
    return views;
  }
}
