package dev.raftlog.spark;

/** A bad option: the message names the option and the reason, as the Python source's. */
public final class OptionException extends IllegalArgumentException {
  private static final long serialVersionUID = 1L;
  public final String option;
  public final String reason;

  public OptionException(String option, String reason) {
    super("raftlog option '" + option + "': " + reason);
    this.option = option;
    this.reason = reason;
  }
}
