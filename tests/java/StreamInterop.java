import com.rabbitmq.stream.Address;
import com.rabbitmq.stream.Consumer;
import com.rabbitmq.stream.Environment;
import com.rabbitmq.stream.OffsetSpecification;
import com.rabbitmq.stream.Producer;
import com.rabbitmq.stream.compression.Compression;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.zip.CRC32;

/**
 * The other side of tests/stream_protocol/test_java_interop.py: RabbitMQ's Java stream client writing
 * and reading sub-entries compressed with each codec, against which the connector's own reader and sink
 * are checked.
 *
 * <pre>
 *   make streamclient
 *   java -cp '.cache/stream-client/*:.cache/stream-client/classes' StreamInterop write URI STREAM CODEC COUNT
 *   java -cp '.cache/stream-client/*:.cache/stream-client/classes' StreamInterop read URI STREAM COUNT
 * </pre>
 *
 * <p>STREAM and CODEC may each be a comma-separated list, paired in order: one JVM (a few seconds of CPU to start)
 * then serves a test's every codec, and prints a line for each stream, in the order given.
 *
 * <p>write: messages with bodies "m-0" .. "m-(COUNT-1)", in sub-entries of 100 compressed with CODEC (none,
 * gzip, snappy, lz4, zstd: the client's default codec factory), every one confirmed; it prints
 * "written N". CODEC "producer" writes each message in an entry of its own, as a producer's: its own message id,
 * a correlation id, a creation time, a subject, a content type, three application properties (a string, an int,
 * a boolean) and a 200-byte JSON body (tests/stream_protocol/test_core_parity.py reads them on both paths). read: the stream's first COUNT messages; it prints "read N crc C", C the CRC-32 of the
 * bodies in offset order, each followed by a newline. Connections go to the uri's host and port whatever
 * the broker advertises (several nodes share this machine). A wait that takes longer than 60 s fails.
 */
public final class StreamInterop {

  public static void main(String[] args) throws Exception {
    if (args.length < 4) {
      System.err.println("usage: StreamInterop write URI STREAM CODEC COUNT | read URI STREAM COUNT");
      System.exit(2);
    }
    URI parsed = new URI(args[1]);
    Address entry = new Address(parsed.getHost(), parsed.getPort() == -1 ? 5552 : parsed.getPort());
    try (Environment environment = Environment.builder().uri(args[1]).addressResolver(address -> entry).build()) {
      String[] streams = args[2].split(",");
      String[] codecs = args[0].equals("write") ? args[3].split(",") : null;
      if (codecs != null && codecs.length != streams.length) {
        throw new IllegalArgumentException(streams.length + " streams and " + codecs.length + " codecs");
      }
      for (int i = 0; i < streams.length; i++) {
        if (codecs != null) {
          write(environment, streams[i], codecs[i], Integer.parseInt(args[4]));
        } else {
          read(environment, streams[i], Integer.parseInt(args[3]));
        }
      }
    }
  }

  private static void write(Environment environment, String stream, String codec, int count) throws Exception {
    CountDownLatch confirmed = new CountDownLatch(count);
    AtomicLong refused = new AtomicLong();
    boolean plain = codec.equals("producer");
    Producer producer =
        plain
            ? environment.producerBuilder().stream(stream).build()
            : environment.producerBuilder().stream(stream).subEntrySize(100).compression(compression(codec)).build();
    for (int i = 0; i < count; i++) {
      byte[] body = ("m-" + i).getBytes(StandardCharsets.UTF_8);
      producer.send(
          plain ? producerMessage(producer, i) : producer.messageBuilder().addData(body).build(),
          status -> {
            if (!status.isConfirmed()) {
              refused.incrementAndGet();
            }
            confirmed.countDown();
          });
    }
    if (!confirmed.await(60, TimeUnit.SECONDS) || refused.get() > 0) {
      System.err.println("not confirmed: " + confirmed.getCount() + " pending, " + refused.get() + " refused");
      System.exit(1);
    }
    producer.close();
    System.out.println("written " + count);
  }

  private static com.rabbitmq.stream.Message producerMessage(Producer producer, int i) {
    String json =
        String.format(
            "{\"order\":\"ord-%010d\",\"customer\":\"cust-%06d\",\"amount\":%d.37,\"currency\":\"EUR\","
                + "\"items\":[{\"sku\":\"sku-%04d\",\"qty\":%d}],\"note\":\"producer-like payload xxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}",
            i, i * 7919 % 100000, i % 1000, i % 977, i % 5 + 1);
    return producer
        .messageBuilder()
        .properties()
        .messageId(String.format("msg-%012d", i))
        .correlationId(String.format("corr-%010d", i / 4))
        .creationTime(1767225600000L + i * 37L)
        .subject(i % 3 == 0 ? "orders.updated" : "orders.created")
        .contentType("application/json")
        .messageBuilder()
        .applicationProperties()
        .entry("tenant", "tenant-" + (i % 13))
        .entry("attempt", i % 1000 - 3)
        .entry("priority_customer", i % 2 == 0)
        .messageBuilder()
        .addData(json.getBytes(StandardCharsets.UTF_8))
        .build();
  }

  private static Compression compression(String codec) {
    switch (codec) {
      case "none":
        return Compression.NONE;
      case "gzip":
        return Compression.GZIP;
      case "snappy":
        return Compression.SNAPPY;
      case "lz4":
        return Compression.LZ4;
      case "zstd":
        return Compression.ZSTD;
      default:
        throw new IllegalArgumentException("unknown codec " + codec);
    }
  }

  private static void read(Environment environment, String stream, int count) throws Exception {
    CountDownLatch done = new CountDownLatch(1);
    CRC32 crc = new CRC32();
    AtomicLong seen = new AtomicLong();
    AtomicLong misplaced = new AtomicLong();
    Consumer consumer =
        environment.consumerBuilder().stream(stream).offset(OffsetSpecification.first())
            .messageHandler(
                (context, message) -> {
                  long n = seen.getAndIncrement();
                  if (n >= count) {
                    return;
                  }
                  if (context.offset() != n) {
                    misplaced.incrementAndGet();
                  }
                  crc.update(message.getBodyAsBinary());
                  crc.update('\n');
                  if (n == count - 1) {
                    done.countDown();
                  }
                })
            .build();
    boolean whole = done.await(60, TimeUnit.SECONDS);
    consumer.close();
    if (!whole) {
      System.err.println("read " + seen.get() + " of " + count);
      System.exit(1);
    }
    System.out.println("read " + count + " crc " + crc.getValue() + " misplaced " + misplaced.get());
  }
}
