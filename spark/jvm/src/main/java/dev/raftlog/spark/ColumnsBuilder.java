package dev.raftlog.spark;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;
import java.util.Arrays;

/**
 * The columns of a {@code /columns} page (see {@link Page}), built row by row into growing
 * byte buffers: a WAL page's records decoded by the reader land in the same layout, so the
 * vectors read them as they read a column page. The buffers are kept from page to page and
 * the page built reads them in place (no copy): it holds until the next page is built, as
 * Spark reads a batch before it asks for the next.
 */
final class ColumnsBuilder {
  private static final VarHandle LONG =
      MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);
  private static final VarHandle INT =
      MethodHandles.byteArrayViewVarHandle(int[].class, ByteOrder.LITTLE_ENDIAN);

  /** A growing little-endian byte buffer. */
  static final class Buf {
    byte[] a = new byte[1024];
    int n;

    void clear() {
      n = 0;
    }

    private void room(int k) {
      if (n + k > a.length) {
        a = Arrays.copyOf(a, Math.max(a.length * 2, n + k));
      }
    }

    void i64(long v) {
      room(8);
      LONG.set(a, n, v);
      n += 8;
    }

    void i32(int v) {
      room(4);
      INT.set(a, n, v);
      n += 4;
    }

    void u8(int v) {
      room(1);
      a[n++] = (byte) v;
    }

    void put(byte[] src, int off, int len) {
      room(len);
      System.arraycopy(src, off, a, n, len);
      n += len;
    }
  }

  final Buf index = new Buf();
  final Buf term = new Buf();
  final Buf timestampMs = new Buf();
  final Buf keyOffsets = new Buf();
  final Buf keyData = new Buf();
  final Buf keyValid = new Buf();
  final Buf valueOffsets = new Buf();
  final Buf valueData = new Buf();
  final Buf valueValid = new Buf();
  final Buf headerOffsets = new Buf();
  final Buf headerKeyOffsets = new Buf();
  final Buf headerKeyData = new Buf();
  final Buf headerValueOffsets = new Buf();
  final Buf headerValueData = new Buf();
  private final Buf[] all = {
    index, term, timestampMs, keyOffsets, keyData, keyValid, valueOffsets, valueData,
    valueValid, headerOffsets, headerKeyOffsets, headerKeyData, headerValueOffsets,
    headerValueData,
  };
  int rows;
  private int headers;

  /** Ready for a new page. */
  void clear() {
    for (Buf b : all) {
      b.clear();
    }
    rows = 0;
    headers = 0;
    keyOffsets.i32(0);
    valueOffsets.i32(0);
    headerOffsets.i32(0);
    headerKeyOffsets.i32(0);
    headerValueOffsets.i32(0);
  }

  /** A row's index and term (then key, value, its headers and {@link #endRow}). */
  void row(long idx, long trm) {
    index.i64(idx);
    term.i64(trm);
  }

  /** A nullable binary (key or value): {@code len < 0} is null. */
  static void binary(Buf offsets, Buf data, Buf valid, byte[] src, int off, int len) {
    if (len >= 0) {
      data.put(src, off, len);
    }
    offsets.i32(data.n);
    valid.u8(len >= 0 ? 1 : 0);
  }

  void header(byte[] src, int kOff, int kLen, int vOff, int vLen) {
    headerKeyData.put(src, kOff, kLen);
    headerKeyOffsets.i32(headerKeyData.n);
    headerValueData.put(src, vOff, vLen);
    headerValueOffsets.i32(headerValueData.n);
    headers++;
  }

  void endRow(long millis) {
    timestampMs.i64(millis);
    headerOffsets.i32(headers);
    rows++;
  }

  /** The page of the rows built, over this builder's buffers (until {@link #clear}). */
  Page build(long partition, long next) {
    Page p = new Page(null); // nothing to parse: its spans are set here
    Page.Span[] spans = {
      p.index, p.term, p.timestampMs, p.keyOffsets, p.keyData, p.keyValid, p.valueOffsets,
      p.valueData, p.valueValid, p.headerOffsets, p.headerKeyOffsets, p.headerKeyData,
      p.headerValueOffsets, p.headerValueData,
    };
    for (int i = 0; i < all.length; i++) {
      spans[i].buf = all[i].a;
      spans[i].offset = 0;
      spans[i].length = all[i].n;
    }
    p.partition = partition;
    p.count = rows;
    p.next = next;
    return p;
  }
}
