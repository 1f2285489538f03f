package dev.raftlog.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import java.io.IOException;
import java.io.InputStream;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyStore;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.time.Duration;
import java.util.HashSet;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;

/**
 * What the source asks of the nodes, over {@link HttpClient} (HTTP/1.1, kept-alive connections
 * shared by the tasks of an executor). Every call has a timeout.
 */
final class Nodes {
  private static final ObjectMapper JSON = new ObjectMapper();
  // One client per trust store ("" for the JVM's): a client owns a thread and a pool.
  private static final ConcurrentHashMap<String, HttpClient> CLIENTS = new ConcurrentHashMap<>();

  private static final String WAL_TYPE = "application/vnd.raftlog.wal+msgpack";

  private final JvmOptions options;
  private final HttpClient client;
  private final WalPage walPage = new WalPage(); // its buffers, reused page after page
  private final Set<String> columnsOnly = new HashSet<>(); // nodes that refuse format=wal

  Nodes(JvmOptions options) {
    this.options = options;
    this.client =
        CLIENTS.computeIfAbsent(options.caFile == null ? "" : options.caFile, Nodes::newClient);
  }

  private static HttpClient newClient(String caFile) {
    HttpClient.Builder b =
        HttpClient.newBuilder()
            .version(HttpClient.Version.HTTP_1_1)
            .connectTimeout(Duration.ofSeconds(10));
    if (!caFile.isEmpty()) {
      b.sslContext(trusting(caFile));
    }
    return b.build();
  }

  /** An SSL context that trusts the PEM certificates of {@code caFile} (as Python's cafile). */
  private static SSLContext trusting(String caFile) {
    try (InputStream in = Files.newInputStream(Path.of(caFile))) {
      KeyStore store = KeyStore.getInstance(KeyStore.getDefaultType());
      store.load(null, null);
      int i = 0;
      for (Certificate c : CertificateFactory.getInstance("X.509").generateCertificates(in)) {
        store.setCertificateEntry("ca" + i++, c);
      }
      TrustManagerFactory tmf =
          TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
      tmf.init(store);
      SSLContext ctx = SSLContext.getInstance("TLS");
      ctx.init(null, tmf.getTrustManagers(), null);
      return ctx;
    } catch (IOException | GeneralSecurityException e) {
      throw new OptionException("caFile", caFile + " cannot be used: " + e);
    }
  }

  /** The body of a 2xx answer; NodeException otherwise (status 0: no answer). */
  byte[] get(String base, String path, double timeoutS) throws NodeException {
    return send(base, path, timeoutS).body();
  }

  private HttpResponse<byte[]> send(String base, String path, double timeoutS)
      throws NodeException {
    HttpRequest.Builder req =
        HttpRequest.newBuilder(URI.create(base + path))
            .timeout(Duration.ofMillis((long) (timeoutS * 1000)))
            .GET();
    if (options.token != null) {
      req.header("Authorization", "Bearer " + options.token);
    }
    HttpResponse<byte[]> resp;
    try {
      resp = client.send(req.build(), HttpResponse.BodyHandlers.ofByteArray());
    } catch (IOException e) {
      throw new NodeException(
          base, 0, JsonNodeFactory.instance.objectNode().put("reason", describe(e)));
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new NodeException(
          base, 0, JsonNodeFactory.instance.objectNode().put("reason", "interrupted"));
    }
    int status = resp.statusCode();
    if (status >= 200 && status < 300) {
      return resp;
    }
    JsonNode body;
    try {
      body = resp.body().length == 0 ? null : JSON.readTree(resp.body());
    } catch (IOException e) {
      String text = new String(resp.body(), 0, Math.min(200, resp.body().length));
      body = JsonNodeFactory.instance.objectNode().put("reason", text);
    }
    throw new NodeException(base, status, body != null && body.isObject() ? body : null);
  }

  JsonNode json(String base, String path, double timeoutS) throws NodeException {
    byte[] raw = get(base, path, timeoutS);
    try {
      return JSON.readTree(raw);
    } catch (IOException e) {
      throw new NodeException(
          base, 0, JsonNodeFactory.instance.objectNode().put("reason", "not JSON: " + e));
    }
  }

  /**
   * A page of committed records [start, stop) (the node's {@code /columns}): a WAL page, whose
   * records this reader checks and decodes itself (the node's CPU is spared), or a column page
   * from a node that refuses {@code format=wal} (400, 404: older than it) or ignores it.
   */
  Page columns(String base, int partition, long start, long stop, int limit)
      throws NodeException {
    String q = "from=" + start + "&to=" + stop + "&limit=" + limit + "&min_index=" + (stop - 1);
    String path = "/v1/partitions/" + partition + "/columns?" + q;
    HttpResponse<byte[]> resp;
    if (columnsOnly.contains(base)) {
      resp = send(base, path, options.timeoutS);
    } else {
      try {
        resp = send(base, path + "&format=wal", options.timeoutS);
      } catch (NodeException e) {
        if (e.status != 400 && e.status != 404) {
          throw e;
        }
        columnsOnly.add(base);
        resp = send(base, path, options.timeoutS);
      }
    }
    boolean wal = resp.headers().firstValue("Content-Type").orElse("").startsWith(WAL_TYPE);
    try {
      return wal ? walPage.decode(resp.body(), start) : Page.parse(resp.body());
    } catch (IllegalArgumentException e) {
      throw new NodeException(
          base, 0, JsonNodeFactory.instance.objectNode().put("reason", "a bad page: " + e));
    }
  }

  private static String describe(IOException e) {
    String m = e.getMessage();
    return e.getClass().getSimpleName() + (m == null ? "" : ": " + m);
  }
}
