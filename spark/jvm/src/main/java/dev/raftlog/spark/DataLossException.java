package dev.raftlog.spark;

/** Records the read needs were compacted away on every replica. */
public final class DataLossException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  DataLossException(int partition, long start, long floor, String where) {
    super(
        "raftlog partition " + partition + ": " + where + " " + start
            + " is below the compaction floor " + floor + " on every replica, so records ["
            + start + ", " + floor + ") are gone; start at earliest, or set "
            + "failOnDataLoss=false to skip them (what is skipped is logged)");
  }
}
