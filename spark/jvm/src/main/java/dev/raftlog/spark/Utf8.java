package dev.raftlog.spark;

/** Strict UTF-8 validation (no overlong forms, no surrogates), as msgspec decodes a str. */
final class Utf8 {
  private Utf8() {}

  static boolean valid(byte[] b, int from, int to) {
    int i = from;
    while (i < to) {
      int c = b[i] & 0xff;
      if (c < 0x80) {
        i++;
        continue;
      }
      int n;
      int min;
      if (c >= 0xc2 && c <= 0xdf) {
        n = 1;
        min = 0x80;
      } else if (c >= 0xe0 && c <= 0xef) {
        n = 2;
        min = 0x800;
      } else if (c >= 0xf0 && c <= 0xf4) {
        n = 3;
        min = 0x10000;
      } else {
        return false;
      }
      if (i + n >= to) {
        return false; // cut short
      }
      int cp = c & (0x3f >> n);
      for (int k = 1; k <= n; k++) {
        int x = b[i + k] & 0xff;
        if ((x & 0xc0) != 0x80) {
          return false;
        }
        cp = cp << 6 | (x & 0x3f);
      }
      if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
        return false;
      }
      i += n + 1;
    }
    return true;
  }
}
