package dev.raftlog.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import java.util.Set;

/** A node answered with an error (status and its JSON body), or did not answer (status 0). */
final class NodeException extends Exception {
  private static final long serialVersionUID = 1L;
  final String url;
  final int status;
  final transient JsonNode body;
  // No answer at all (refused, reset, timed out), as opposed to an answer that could not be
  // read (a damaged page, not JSON), which is status 0 too.
  final boolean silent;

  NodeException(String url, int status, JsonNode body) {
    this(url, status, body, false);
  }

  private NodeException(String url, int status, JsonNode body, boolean silent) {
    super(url + ": " + describe(status, body, silent));
    this.url = url;
    this.status = status;
    this.body = body == null ? JsonNodeFactory.instance.objectNode() : body;
    this.silent = silent;
  }

  /** The node gave no answer: {@code why} says how the call ended. */
  static NodeException silent(String url, String why) {
    return new NodeException(
        url, 0, JsonNodeFactory.instance.objectNode().put("reason", why), true);
  }

  /** As the Python client's {@code ClientError} says it: {@code HTTP 503 behind: ...}, with
   * the field a refusal names, or {@code no answer: ...}. */
  private static String describe(int status, JsonNode body, boolean silent) {
    if (silent) {
      return "no answer: " + reason(body);
    }
    if (status == 0) {
      return reason(body); // an answer that could not be read
    }
    String error = body != null && body.hasNonNull("error") ? body.get("error").asText() : "error";
    String field =
        body != null && body.hasNonNull("field") && !body.get("field").asText().isEmpty()
            ? " (field " + body.get("field").asText() + ")"
            : "";
    return "HTTP " + status + " " + error + field + ": " + reason(body);
  }

  private static String reason(JsonNode body) {
    if (body != null && body.hasNonNull("reason")) {
      return body.get("reason").asText();
    }
    if (body != null && body.hasNonNull("error")) {
      return body.get("error").asText();
    }
    // An answer without a body (HttpURLConnection gives none of a 401 to a streamed PUT):
    // "no answer" here was taken for a node that never answered.
    return "an answer without a body";
  }

  /**
   * The answers another replica (or a later try) may not give: Python's {@code
   * raftlog.client.retry.RETRIED_STATUSES}, restated (tests/client/test_retry.py fails when the
   * two differ; the reasons are there). 500 is not one: the node answers it only for a bug.
   */
  static final Set<Integer> RETRIED_STATUSES = Set.of(421, 502, 503, 504);

  /** The node does not hold the partition asked for (404 {@code unknown_partition}). */
  boolean unknownPartition() {
    return status == 404 && "unknown_partition".equals(body.path("error").asText());
  }

  /** No answer, or an answer that another replica (or a later try) may not give. */
  boolean retryable() {
    return status == 0 || RETRIED_STATUSES.contains(status);
  }
}
