import com.rabbitmq.stream.Address;
import com.rabbitmq.stream.Consumer;
import com.rabbitmq.stream.Environment;
import com.rabbitmq.stream.OffsetSpecification;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

/**
 * The stream-protocol baseline of benchmarks/stream_throughput.py: RabbitMQ's Java stream client
 * reading the first COUNT messages of a stream (offsets 0 .. COUNT-1) and printing the rate.
 *
 * <pre>
 *   make streamclient
 *   java -cp '.cache/stream-client/*:.cache/stream-client/classes' StreamConsume URI STREAM COUNT [READERS [WARMUP]]
 * </pre>
 *
 * <p>With READERS > 1 the offsets are split into that many equal ranges, each read by its own consumer
 * on its own connection, as the source's numPartitions splits them into tasks. Reader 0 subscribes at
 * "first", the others at their range's first offset; a reader counts only the offsets of its range.
 * The client decodes every message (AMQP 1.0) before the handler sees it. Connections go to the uri's
 * host and port whatever the broker advertises (several nodes share this machine). The time runs from
 * the first subscription to the last reader's last message, after an unmeasured read of the first
 * WARMUP messages (default 0) by one reader in the same JVM. With -Dwait=true it prints "ready" after the
 * warm-up and waits for a line on stdin before the measured read. It prints "rate N msg/s ...".
 */
public final class StreamConsume {

  public static void main(String[] args) throws Exception {
    if (args.length < 3) {
      System.err.println("usage: StreamConsume URI STREAM COUNT [READERS [WARMUP]]");
      System.exit(2);
    }
    String uri = args[0];
    String stream = args[1];
    long count = Long.parseLong(args[2]);
    int readers = args.length > 3 ? Integer.parseInt(args[3]) : 1;
    long warmup = args.length > 4 ? Long.parseLong(args[4]) : 0;
    URI parsed = new URI(uri);
    Address entry = new Address(parsed.getHost(), parsed.getPort() == -1 ? 5552 : parsed.getPort());
    try (Environment environment =
        Environment.builder()
            .uri(uri)
            .addressResolver(address -> entry)
            .maxConsumersByConnection(1)
            .build()) {
      if (warmup > 0) {
        read(environment, stream, Math.min(warmup, count), 1); // the JIT compiles the hot path; not measured
      }
      if (Boolean.getBoolean("wait")) { // stream_throughput.py measures CPU from its go
        System.out.println("ready");
        System.out.flush();
        new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8)).readLine();
      }
      double[] seconds = read(environment, stream, count, readers);
      System.out.printf(
          "rate %.0f msg/s, %d messages in %.3f s (the first after %.3f s), %d reader(s), after a warm-up read of %d%n",
          count / seconds[0], count, seconds[0], seconds[1], readers, Math.min(warmup, count));
      System.out.flush();
    }
  }

  /**
   * Seconds to read offsets 0 .. count-1 with readers consumers, from the first subscription to the last message,
   * and from it to the first message.
   */
  static double[] read(Environment environment, String stream, long count, int readers) throws InterruptedException {
    CountDownLatch done = new CountDownLatch(readers);
    AtomicLong first = new AtomicLong();
    List<Consumer> consumers = new ArrayList<>();
    long start = System.nanoTime();
    for (int i = 0; i < readers; i++) {
      long from = count * i / readers;
      long to = count * (i + 1) / readers;
      long[] seen = {0}; // one consumer's messages arrive on one thread
      consumers.add(
          environment.consumerBuilder()
              .stream(stream)
              .offset(i == 0 ? OffsetSpecification.first() : OffsetSpecification.offset(from))
              .noTrackingStrategy()
              .messageHandler(
                  (context, message) -> {
                    if (seen[0] == 0) {
                      first.compareAndSet(0, System.nanoTime());
                    }
                    long offset = context.offset();
                    if (offset >= from && offset < to && ++seen[0] == to - from) {
                      done.countDown();
                    }
                  })
              .build());
    }
    if (!done.await(600, TimeUnit.SECONDS)) {
      System.err.println("StreamConsume: not every reader got its messages within 600 s");
      System.exit(1);
    }
    long end = System.nanoTime();
    consumers.forEach(Consumer::close);
    return new double[] {(end - start) / 1e9, (first.get() - start) / 1e9};
  }
}
