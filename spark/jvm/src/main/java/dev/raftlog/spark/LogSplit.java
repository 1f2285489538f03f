package dev.raftlog.spark;

import java.util.Arrays;
import org.apache.spark.sql.connector.read.InputPartition;

/** Committed records [start, stop) of one raftlog partition, from {@code replicas} in order. */
final class LogSplit implements InputPartition {
  private static final long serialVersionUID = 1L;
  final int partition;
  final long start;
  final long stop;
  final String[] replicas;

  LogSplit(int partition, long start, long stop, String[] replicas) {
    this.partition = partition;
    this.start = start;
    this.stop = stop;
    this.replicas = replicas;
  }

  @Override
  public String toString() {
    return "LogSplit(p" + partition + " [" + start + ", " + stop + ") from "
        + Arrays.toString(replicas) + ")";
  }
}
