package dev.raftlog.spark.vectors;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarArray;
import org.apache.spark.sql.vectorized.ColumnarMap;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * A column read in place from a page's bytes: each subclass answers the getters of its type;
 * the others are not called by Spark for that type and refuse.
 */
abstract class ReadOnlyVector extends ColumnVector {
  static final VarHandle LONG =
      MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);
  static final VarHandle INT =
      MethodHandles.byteArrayViewVarHandle(int[].class, ByteOrder.LITTLE_ENDIAN);

  ReadOnlyVector(DataType type) {
    super(type);
  }

  /** The nulls of a validity buffer (one byte per row, 0: null). */
  static int countNulls(byte[] buf, int offset, int rows) {
    int nulls = 0;
    for (int i = 0; i < rows; i++) {
      if (buf[offset + i] == 0) {
        nulls++;
      }
    }
    return nulls;
  }

  private UnsupportedOperationException wrongType() {
    return new UnsupportedOperationException(getClass().getSimpleName() + " of " + type);
  }

  @Override
  public void close() {} // the page's bytes are the garbage collector's

  @Override
  public boolean hasNull() {
    return numNulls() > 0;
  }

  @Override
  public int numNulls() {
    return 0;
  }

  @Override
  public boolean isNullAt(int rowId) {
    return false;
  }

  @Override
  public boolean getBoolean(int rowId) {
    throw wrongType();
  }

  @Override
  public byte getByte(int rowId) {
    throw wrongType();
  }

  @Override
  public short getShort(int rowId) {
    throw wrongType();
  }

  @Override
  public int getInt(int rowId) {
    throw wrongType();
  }

  @Override
  public long getLong(int rowId) {
    throw wrongType();
  }

  @Override
  public float getFloat(int rowId) {
    throw wrongType();
  }

  @Override
  public double getDouble(int rowId) {
    throw wrongType();
  }

  @Override
  public ColumnarArray getArray(int rowId) {
    throw wrongType();
  }

  @Override
  public ColumnarMap getMap(int ordinal) {
    throw wrongType();
  }

  @Override
  public Decimal getDecimal(int rowId, int precision, int scale) {
    throw wrongType();
  }

  @Override
  public UTF8String getUTF8String(int rowId) {
    throw wrongType();
  }

  @Override
  public byte[] getBinary(int rowId) {
    throw wrongType();
  }

  @Override
  public ColumnVector getChild(int ordinal) {
    throw wrongType();
  }
}
