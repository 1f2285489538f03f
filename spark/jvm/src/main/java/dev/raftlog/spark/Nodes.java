package dev.raftlog.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import java.io.IOException;
import java.io.InputStream;
import java.net.HttpURLConnection;
import java.net.URI;
import java.net.URLEncoder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyStore;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.util.Arrays;
import java.util.HashSet;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import javax.net.ssl.HttpsURLConnection;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLSocketFactory;
import javax.net.ssl.TrustManagerFactory;

/**
 * What the source asks of the nodes, over {@link HttpURLConnection} (HTTP/1.1, the JVM's
 * kept-alive connections shared by the tasks of an executor). Every call has a timeout. The
 * blocking client reads a body straight into one buffer kept from call to call: the
 * asynchronous {@code java.net.http.HttpClient} cost several times the CPU per page (a
 * selector thread, a new 16 KiB buffer per socket read, the chunks joined into a new array),
 * more than decoding the page's records.
 */
final class Nodes {
  private static final ObjectMapper JSON = new ObjectMapper();
  // One socket factory per CA file: loading the certificates once per executor.
  private static final ConcurrentHashMap<String, SSLSocketFactory> TLS = new ConcurrentHashMap<>();
  private static final int CONNECT_TIMEOUT_MS = 10_000;

  private static final String WAL_TYPE = "application/vnd.raftlog.wal+msgpack";

  private final JvmOptions options;
  private final SSLSocketFactory tls; // null: the JVM's default trust
  private final WalPage walPage = new WalPage(); // its buffers, reused page after page
  private final Set<String> columnsOnly = new HashSet<>(); // nodes that refuse format=wal
  private byte[] body = new byte[1 << 16]; // the last answer's body is [0, bodyLength)
  private int bodyLength;
  private String contentType = "";

  Nodes(JvmOptions options) {
    this.options = options;
    this.tls = options.caFile == null ? null : TLS.computeIfAbsent(options.caFile, Nodes::trusting);
  }

  /** A socket factory that trusts the PEM certificates of {@code caFile} (as Python's cafile). */
  private static SSLSocketFactory trusting(String caFile) {
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
      return ctx.getSocketFactory();
    } catch (IOException | GeneralSecurityException e) {
      throw new OptionException("caFile", caFile + " cannot be used: " + e);
    }
  }

  private void send(String base, String path, double timeoutS) throws NodeException {
    send(base, "GET", path, null, timeoutS);
  }

  /** base + path: a 2xx answer's body in {@link #body}; else NodeException (0: no answer). */
  private void send(String base, String method, String path, byte[] json, double timeoutS)
      throws NodeException {
    HttpURLConnection c = null;
    try {
      c = (HttpURLConnection) URI.create(base + path).toURL().openConnection();
      c.setRequestMethod(method);
      if (tls != null && c instanceof HttpsURLConnection https) {
        https.setSSLSocketFactory(tls);
      }
      c.setConnectTimeout(CONNECT_TIMEOUT_MS);
      c.setReadTimeout((int) Math.max(1, Math.min(Integer.MAX_VALUE, timeoutS * 1000)));
      c.setUseCaches(false);
      c.setInstanceFollowRedirects(false); // a node's answer is the answer
      if (options.token != null) {
        c.setRequestProperty("Authorization", "Bearer " + options.token);
      }
      if (json != null) {
        c.setDoOutput(true);
        c.setRequestProperty("Content-Type", "application/json");
        // Not streamed (a hold's body is small): HttpURLConnection gives no error body of a
        // 401 to a streamed request, and the node's reason was lost.
        try (var out = c.getOutputStream()) {
          out.write(json);
        }
      }
      int status = c.getResponseCode();
      boolean ok = status >= 200 && status < 300;
      try (InputStream in = ok ? c.getInputStream() : c.getErrorStream()) {
        read(in, c.getContentLengthLong());
      }
      contentType = c.getContentType() == null ? "" : c.getContentType();
      if (!ok) {
        throw failed(base, status);
      }
    } catch (IOException e) {
      if (c != null) {
        c.disconnect(); // not back to the pool half read
      }
      throw NodeException.silent(base, describe(e));
    }
  }

  /** The whole body (of {@code length} bytes, or up to the end when -1) into {@link #body}. */
  private void read(InputStream in, long length) throws IOException {
    bodyLength = 0;
    if (in == null) {
      return; // an error without a body
    }
    if (length > Integer.MAX_VALUE - 8) {
      throw new IOException("an answer of " + length + " bytes");
    }
    if (length > body.length) {
      body = new byte[(int) length];
    }
    while (true) {
      if (bodyLength == body.length) {
        if (length >= 0) {
          return;
        }
        body = Arrays.copyOf(body, 2 * body.length);
      }
      int n = in.read(body, bodyLength, body.length - bodyLength);
      if (n < 0) {
        if (length >= 0 && bodyLength < length) {
          throw new IOException("the answer ends after " + bodyLength + " of " + length + " bytes");
        }
        return;
      }
      bodyLength += n;
      if (bodyLength == length) {
        return;
      }
    }
  }

  private NodeException failed(String base, int status) {
    JsonNode parsed;
    try {
      parsed = bodyLength == 0 ? null : JSON.readTree(body, 0, bodyLength);
    } catch (IOException e) {
      String text = new String(body, 0, Math.min(200, bodyLength), StandardCharsets.UTF_8);
      parsed = JsonNodeFactory.instance.objectNode().put("reason", text);
    }
    return new NodeException(base, status, parsed != null && parsed.isObject() ? parsed : null);
  }

  double timeoutS() {
    return options.timeoutS;
  }

  JsonNode json(String base, String path, double timeoutS) throws NodeException {
    send(base, path, timeoutS);
    try {
      return JSON.readTree(body, 0, bodyLength);
    } catch (IOException e) {
      throw new NodeException(
          base, 0, JsonNodeFactory.instance.objectNode().put("reason", "not JSON: " + e));
    }
  }

  /** The retention hold of {@code holder} on a partition moved to {@code minIndex}. */
  void setHold(String base, int partition, String holder, long minIndex, double ttlS)
      throws NodeException {
    String path =
        "/v1/admin/partitions/" + partition + "/holds/"
            + URLEncoder.encode(holder, StandardCharsets.UTF_8).replace("+", "%20");
    byte[] json =
        JsonNodeFactory.instance.objectNode()
            .put("min_index", minIndex)
            .put("ttl_seconds", ttlS)
            .toString()
            .getBytes(StandardCharsets.UTF_8);
    send(base, "PUT", path, json, options.timeoutS);
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
    if (columnsOnly.contains(base)) {
      send(base, path, options.timeoutS);
    } else {
      try {
        send(base, path + "&format=wal", options.timeoutS);
      } catch (NodeException e) {
        if ((e.status != 400 && e.status != 404) || e.unknownPartition()) {
          throw e;
        }
        columnsOnly.add(base);
        send(base, path, options.timeoutS);
      }
    }
    try {
      return contentType.startsWith(WAL_TYPE)
          ? walPage.decode(body, bodyLength, start)
          : Page.parse(Arrays.copyOf(body, bodyLength)); // its vectors keep the bytes
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
