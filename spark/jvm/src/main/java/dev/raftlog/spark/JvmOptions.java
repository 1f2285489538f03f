package dev.raftlog.spark;

import java.io.IOException;
import java.io.Serializable;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.function.Function;
import java.util.function.Predicate;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The options of the {@code raftlog-jvm} source: the names, defaults, checks and messages of the
 * Python source's ({@code raftlog.spark.options}) for reads of the log, batch and streaming.
 */
final class JvmOptions implements Serializable {
  private static final long serialVersionUID = 1L;

  // The Python source's documented options.
  private static final Set<String> DOC =
      new TreeSet<>(
          Set.of(
              "endpoints", "partitions", "startingOffsets", "endingOffsets", "startingTimestamp",
              "startingOffsetsByTimestamp", "startingOffsetsByTimestampStrategy",
              "endingTimestamp", "endingOffsetsByTimestamp", "mode",
              "preferFollowers", "token", "tokenFile", "caFile", "maxRecordsPerSplit",
              "minPartitions", "maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay",
              "failOnDataLoss", "includeHeaders", "retentionHold", "retentionHoldTtlSeconds", "timeoutSeconds",
              "pageRecords"));
  // Spark's time strings (JavaUtils.timeStringAsMs), as Kafka's maxTriggerDelay takes them.
  private static final Pattern DURATION =
      Pattern.compile("^\\s*(\\d+)\\s*(us|ms|s|m|min|h|d)?\\s*$", Pattern.CASE_INSENSITIVE);

  final String[] endpoints;
  final int[] partitions; // null: all of them
  final Offsets starting;
  final Offsets ending;
  final Times startingTimes; // null: by offsets
  final Times endingTimes; // null: by offsets
  final boolean noMatchLatest; // a start time no record reaches: latest (else an error)
  final boolean preferFollowers;
  final String token; // null: none
  final String caFile; // null: the JVM's trust store
  final long maxRecordsPerSplit;
  final int minPartitions; // 0: no minimum
  final long maxOffsetsPerTrigger; // 0: no maximum
  final long minOffsetsPerTrigger; // 0: no minimum
  final double maxTriggerDelayS;
  final boolean failOnDataLoss;
  final boolean includeHeaders; // Kafka's headers type instead of a map of strings
  final String retentionHold; // null: no hold
  final double retentionHoldTtlS;
  final double timeoutS;
  final int pageRecords;

  private JvmOptions(Map<String, String> o, boolean streaming) {
    endpoints = endpoints(o);
    partitions = partitions(o);
    String mode = o.getOrDefault("mode", "log").strip().toLowerCase(Locale.ROOT);
    if (!mode.equals("log") && !mode.equals("table")) {
      throw new OptionException("mode", "must be log or table, got " + repr(o.get("mode")));
    }
    if (mode.equals("table")) {
      throw new OptionException(
          "mode", "table is read by format raftlog (the Python source); raftlog-jvm reads "
              + "mode=log");
    }
    starting =
        Offsets.parse(
            "startingOffsets",
            o.get("startingoffsets"),
            streaming ? Offsets.LATEST_ALL : Offsets.EARLIEST_ALL,
            false);
    if (streaming && o.containsKey("endingoffsets")) {
      throw new OptionException("endingOffsets", "is for batch reads; a stream has no end");
    }
    ending = Offsets.parse("endingOffsets", o.get("endingoffsets"), Offsets.LATEST_ALL, true);
    startingTimes =
        Times.parse(o, "startingTimestamp", "startingOffsetsByTimestamp", "startingOffsets");
    endingTimes = Times.parse(o, "endingTimestamp", "endingOffsetsByTimestamp", "endingOffsets");
    if (streaming && endingTimes != null) {
      throw new OptionException(endingTimes.option, "is for batch reads; a stream has no end");
    }
    String strategy =
        o.getOrDefault("startingoffsetsbytimestampstrategy", "error").strip()
            .toLowerCase(Locale.ROOT);
    if (!strategy.equals("error") && !strategy.equals("latest")) {
      throw new OptionException(
          "startingOffsetsByTimestampStrategy", "must be error or latest, got '" + strategy + "'");
    }
    noMatchLatest = strategy.equals("latest");
    token = token(o);
    String ca = o.get("cafile");
    if (ca != null && !ca.isEmpty() && !Files.isRegularFile(Path.of(ca))) {
      throw new OptionException("caFile", ca + " is not a file");
    }
    caFile = ca == null || ca.isEmpty() ? null : ca;
    String hold = o.get("retentionhold");
    if (hold != null) {
      hold = hold.strip();
      if (!streaming) {
        throw new OptionException(
            "retentionHold", "holds are for streams (a batch range is fixed)");
      }
      int chars = hold.codePointCount(0, hold.length());
      if (chars == 0 || chars > 200 || !printable(hold) || hold.contains("/")) {
        throw new OptionException(
            "retentionHold",
            "must be a holder name of 1 to 200 printable characters without '/'");
      }
    }
    retentionHold = hold;
    maxRecordsPerSplit = integer(o, "maxRecordsPerSplit", 200_000, 1, 1L << 40);
    pageRecords = (int) integer(o, "pageRecords", 20_000, 1, 50_000);
    maxOffsetsPerTrigger = integer(o, "maxOffsetsPerTrigger", 0, 1, 1L << 40);
    minOffsetsPerTrigger = integer(o, "minOffsetsPerTrigger", 0, 1, 1L << 40);
    for (String name : new String[] {"maxOffsetsPerTrigger", "minOffsetsPerTrigger",
        "maxTriggerDelay"}) {
      if (o.containsKey(name.toLowerCase(Locale.ROOT)) && !streaming) {
        throw new OptionException(name, "is for streams (readStream)");
      }
    }
    if (o.containsKey("maxtriggerdelay") && minOffsetsPerTrigger == 0) {
      throw new OptionException(
          "maxTriggerDelay", "bounds the wait of minOffsetsPerTrigger: set both");
    }
    if (maxOffsetsPerTrigger > 0 && minOffsetsPerTrigger > maxOffsetsPerTrigger) {
      throw new OptionException(
          "minOffsetsPerTrigger",
          minOffsetsPerTrigger + " is more than maxOffsetsPerTrigger (" + maxOffsetsPerTrigger
              + ")");
    }
    minPartitions = (int) integer(o, "minPartitions", 0, 1, 1_000_000);
    preferFollowers = bool(o, "preferFollowers", true);
    failOnDataLoss = bool(o, "failOnDataLoss", true);
    includeHeaders = bool(o, "includeHeaders", false);
    retentionHoldTtlS = number(o, "retentionHoldTtlSeconds", 3600.0, 1.0, 30 * 86400.0);
    maxTriggerDelayS = duration(o, "maxTriggerDelay", 15 * 60.0);
    timeoutS = number(o, "timeoutSeconds", 30.0, 0.1, 3600.0);
  }

  /** includeHeaders as Spark asks for the schema, before the options are checked (a bad value
   * is refused then, naming it). */
  static boolean includeHeaders(Map<String, String> raw) {
    for (Map.Entry<String, String> e : raw.entrySet()) {
      if (e.getKey().equalsIgnoreCase("includeHeaders")) {
        return Set.of("true", "1", "yes").contains(e.getValue().strip().toLowerCase(Locale.ROOT));
      }
    }
    return false;
  }

  /** Every option checked; OptionException names the first bad one. */
  static JvmOptions parse(Map<String, String> raw, boolean streaming) {
    Map<String, String> o = new TreeMap<>();
    raw.forEach((k, v) -> o.put(k.toLowerCase(Locale.ROOT), v));
    if (o.containsKey("maxrecordspertrigger")) {
      throw new OptionException(
          "maxRecordsPerTrigger", "is spelt maxOffsetsPerTrigger (the name of Kafka's source)");
    }
    Set<String> known = new TreeSet<>();
    DOC.forEach(d -> known.add(d.toLowerCase(Locale.ROOT)));
    known.add("path"); // Spark passes load(path) as "path"
    for (String k : o.keySet()) {
      if (!known.contains(k)) {
        throw new OptionException(
            k, "unknown option (known: " + String.join(", ", DOC) + ")");
      }
    }
    String path = o.get("path");
    if (path != null && !path.isEmpty()) {
      throw new OptionException(
          "path", "the raftlog source takes no path; give option('endpoints', ...)");
    }
    return new JvmOptions(o, streaming);
  }

  /** Python's str.isprintable, the node's rule for a holder's name: no control, format,
   *  private-use, unassigned or separator characters but the ASCII space. */
  private static boolean printable(String s) {
    return s.codePoints().allMatch(cp -> {
      if (cp == ' ') {
        return true;
      }
      switch (Character.getType(cp)) {
        case Character.CONTROL, Character.FORMAT, Character.SURROGATE, Character.PRIVATE_USE,
            Character.UNASSIGNED, Character.LINE_SEPARATOR, Character.PARAGRAPH_SEPARATOR,
            Character.SPACE_SEPARATOR:
          return false;
        default:
          return true;
      }
    });
  }

  private static String repr(String s) {
    return s == null ? "None" : "'" + s + "'";
  }

  private static String[] endpoints(Map<String, String> o) {
    String raw = o.getOrDefault("endpoints", "").strip();
    if (raw.isEmpty()) {
      throw new OptionException(
          "endpoints", "is required: comma-separated node URLs (http://host:port)");
    }
    return java.util.Arrays.stream(raw.split(","))
        .map(String::strip)
        .filter(e -> !e.isEmpty())
        .map(e -> e.replaceAll("/+$", ""))
        .peek(
            e -> {
              if (!e.startsWith("http://") && !e.startsWith("https://")) {
                throw new OptionException("endpoints", repr(e) + " is not an http(s) URL");
              }
            })
        .distinct() // each once: a replica named twice was counted twice (see the Python)
        .toArray(String[]::new);
  }

  private static int[] partitions(Map<String, String> o) {
    String raw = o.get("partitions");
    if (raw == null || raw.isBlank()) {
      return null;
    }
    TreeSet<Integer> out = new TreeSet<>();
    try {
      for (String p : raw.split(",")) {
        if (!p.isBlank()) {
          out.add(Integer.parseInt(p.strip()));
        }
      }
    } catch (NumberFormatException e) {
      throw new OptionException(
          "partitions", "must be comma-separated partition numbers, got " + repr(raw));
    }
    if (out.isEmpty() || out.first() < 0) {
      throw new OptionException(
          "partitions", "must be non-negative partition numbers: " + repr(raw));
    }
    return out.stream().mapToInt(Integer::intValue).toArray();
  }

  private static String token(Map<String, String> o) {
    String token = o.get("token");
    String file = o.get("tokenfile");
    boolean hasToken = token != null && !token.isEmpty();
    if (hasToken && file != null && !file.isEmpty()) {
      throw new OptionException("tokenFile", "give token or tokenFile, not both");
    }
    if (file != null && !file.isEmpty()) {
      try {
        token = Files.readString(Path.of(file)).strip();
      } catch (IOException e) {
        throw new OptionException("tokenFile", "cannot be read: " + e);
      }
      if (token.isEmpty()) {
        throw new OptionException("tokenFile", file + " is empty");
      }
      return token;
    }
    return hasToken ? token : null;
  }

  private static boolean bool(Map<String, String> o, String name, boolean dflt) {
    String raw = o.get(name.toLowerCase(Locale.ROOT));
    if (raw == null) {
      return dflt;
    }
    String v = raw.strip().toLowerCase(Locale.ROOT);
    if (Set.of("true", "1", "yes").contains(v)) {
      return true;
    }
    if (Set.of("false", "0", "no").contains(v)) {
      return false;
    }
    throw new OptionException(name, "must be true or false, got " + repr(raw));
  }

  private static long integer(Map<String, String> o, String name, long dflt, long lo, long hi) {
    return bounded(o, name, dflt, Long::parseLong, "an integer", v -> v >= lo && v <= hi, lo, hi);
  }

  private static double duration(Map<String, String> o, String name, double dfltS) {
    String raw = o.get(name.toLowerCase(Locale.ROOT));
    if (raw == null) {
      return dfltS;
    }
    Matcher m = DURATION.matcher(raw);
    if (!m.matches()) {
      throw new OptionException(
          name, "must be a duration such as 30s, 15m or 1h, got " + repr(raw));
    }
    String unit = m.group(2) == null ? "ms" : m.group(2).toLowerCase(Locale.ROOT);
    double perUnit =
        switch (unit) {
          case "us" -> 1e-6;
          case "ms" -> 1e-3;
          case "s" -> 1.0;
          case "m", "min" -> 60.0;
          case "h" -> 3600.0;
          default -> 86400.0;
        };
    try {
      return Long.parseLong(m.group(1)) * perUnit;
    } catch (NumberFormatException e) {
      throw new OptionException(
          name, "must be a duration such as 30s, 15m or 1h, got " + repr(raw));
    }
  }

  /** Decimal notation only, as the Python reader's {@code decimal}: {@code parseDouble} also
   * took "1d" and hexadecimal "0x1p3". */
  private static final java.util.regex.Pattern DECIMAL =
      java.util.regex.Pattern.compile("[+-]?([0-9]+\\.?[0-9]*|\\.[0-9]+)([eE][+-]?[0-9]+)?");

  private static double decimal(String text) {
    String t = text.strip();
    if (!DECIMAL.matcher(t).matches()) {
      throw new NumberFormatException("not a decimal number: " + t);
    }
    return Double.parseDouble(t);
  }

  private static double number(
      Map<String, String> o, String name, double dflt, double lo, double hi) {
    return bounded(o, name, dflt, JvmOptions::decimal, "a number", v -> v >= lo && v <= hi, lo, hi);
  }

  /**
   * The option {@code name} parsed, {@code dflt} when it is not set: an OptionException when it
   * does not parse (as {@code what}) or is not within [lo, hi] (a NaN is not).
   */
  private static <T> T bounded(
      Map<String, String> o,
      String name,
      T dflt,
      Function<String, T> parse,
      String what,
      Predicate<T> within,
      T lo,
      T hi) {
    String raw = o.get(name.toLowerCase(Locale.ROOT));
    if (raw == null) {
      return dflt;
    }
    T v;
    try {
      v = parse.apply(raw.strip());
    } catch (NumberFormatException e) {
      throw new OptionException(name, "must be " + what + ", got " + repr(raw));
    }
    if (!within.test(v)) {
      throw new OptionException(name, "must be between " + lo + " and " + hi + ", got " + v);
    }
    return v;
  }
}
