package dev.raftlog.spark.vectors;

import org.apache.spark.sql.types.DataTypes;

/** The same int on every row (the raftlog partition of a page). */
public final class ConstantIntVector extends ReadOnlyVector {
  private final int value;

  public ConstantIntVector(int value) {
    super(DataTypes.IntegerType);
    this.value = value;
  }

  @Override
  public int getInt(int rowId) {
    return value;
  }
}
