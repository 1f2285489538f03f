package dev.raftlog.spark;

import java.util.ArrayList;
import java.util.List;

/** What the answering replicas of one raftlog partition said of it at planning. */
final class PartitionView {
  /** {@code floor}: the lowest index it serves (below its compaction floor from the archive);
   * {@code compactionFloor}: the lowest its own log holds. */
  record Replica(
      String url, boolean leader, long highWaterMark, long floor, long compactionFloor) {}

  final int partition;
  final List<Replica> replicas = new ArrayList<>();

  PartitionView(int partition) {
    this.partition = partition;
  }

  /** The highest committed index any answering replica knows (each is committed). */
  long highWaterMark() {
    return replicas.stream().mapToLong(Replica::highWaterMark).max().orElse(0);
  }

  /** The lowest index some replica still has. */
  long earliest() {
    return replicas.stream().mapToLong(Replica::floor).min().orElse(1);
  }

  /**
   * Replicas to read [.., stop) from, best first: those that already have it first; among
   * them, followers first when {@code preferFollowers} (spread over splits by {@code rotate}),
   * the leader first otherwise. The Python source's order.
   */
  String[] order(boolean preferFollowers, long stop, int rotate) {
    List<String> followers = new ArrayList<>();
    List<String> leaders = new ArrayList<>();
    for (Replica r : replicas) {
      (r.leader() ? leaders : followers).add(r.url());
    }
    if (!followers.isEmpty()) {
      int k = Math.floorMod(rotate, followers.size());
      List<String> rotated = new ArrayList<>(followers.subList(k, followers.size()));
      rotated.addAll(followers.subList(0, k));
      followers = rotated;
    }
    List<String> order = new ArrayList<>(preferFollowers ? followers : leaders);
    order.addAll(preferFollowers ? leaders : followers);
    List<String> have = new ArrayList<>();
    List<String> behind = new ArrayList<>();
    for (String url : order) {
      boolean has =
          replicas.stream().anyMatch(r -> r.url().equals(url) && r.highWaterMark() >= stop - 1);
      (has ? have : behind).add(url);
    }
    have.addAll(behind);
    return have.toArray(String[]::new);
  }
}
