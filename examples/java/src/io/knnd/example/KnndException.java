package io.knnd.example;

/**
 * A failed call: the status knnd answered (gRPC's code name, e.g.
 * INVALID_ARGUMENT or RESOURCE_EXHAUSTED) and its message, which names
 * the input and the limit. Over HTTP the same code name comes in the
 * error body beside the HTTP status.
 */
public final class KnndException extends RuntimeException {
  private final String code;

  public KnndException(String code, String message, Throwable cause) {
    super(code + ": " + message, cause);
    this.code = code;
  }

  /** gRPC's name of the status code, e.g. "INVALID_ARGUMENT". */
  public String code() {
    return code;
  }
}
