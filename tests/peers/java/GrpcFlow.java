import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Collections;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.SimpleConsumer;
import org.apache.rocketmq.client.apis.message.Message;
import org.apache.rocketmq.client.apis.message.MessageView;
import org.apache.rocketmq.client.apis.producer.Producer;
import org.apache.rocketmq.client.apis.producer.SendReceipt;

/**
 * One pass of Apache's gRPC Java client (rocketmq-client-java) through a 5.x proxy, for
 * tests/integration/test_rocketmq_proxy.py: a producer sends COUNT normal messages and COUNT FIFO
 * messages (alternating between two message groups), then a SimpleConsumer per topic receives and acks
 * until it has seen every one of them or the deadline passes.
 *
 * <pre>
 * java -cp GRPC_CLIENT_JARS:OUT GrpcFlow -e PROXY -t NORMAL_TOPIC -f FIFO_TOPIC -g GROUP -G FIFO_GROUP
 *      [-c COUNT] [-w SECONDS]
 * </pre>
 *
 * Lines on stdout: {@code SENT <kind> <seq> <msgId>} per send; {@code GOT <kind> <group> <seq> <attempt>}
 * per delivery, in the order received ({@code -} for no group); {@code ACKED <kind> <seq>} per ack;
 * {@code DONE} once every message was received, or {@code ERR <message>}; the exit code is 0 for DONE.
 * The kind is {@code normal} or {@code fifo}, the body {@code <kind>:<seq>}.
 */
public final class GrpcFlow {
    private GrpcFlow() {
    }

    public static void main(String[] args) throws Exception {
        Map<String, String> opts = new HashMap<>();
        for (int i = 0; i + 1 < args.length; i += 2) {
            opts.put(args[i], args[i + 1]);
        }
        int count = Integer.parseInt(opts.getOrDefault("-c", "20"));
        long deadline = System.currentTimeMillis() + 1000L * Long.parseLong(opts.getOrDefault("-w", "60"));
        String normalTopic = opts.get("-t");
        String fifoTopic = opts.get("-f");
        ClientServiceProvider provider = ClientServiceProvider.loadService();
        // the proxy serves plaintext too while tlsTestModeEnable (its default) is on
        ClientConfiguration conf = ClientConfiguration.newBuilder()
            .setEndpoints(opts.get("-e"))
            .enableSsl(false)
            .setRequestTimeout(Duration.ofSeconds(10))
            .build();
        try {
            try (Producer producer = provider.newProducerBuilder()
                .setClientConfiguration(conf)
                .setTopics(normalTopic, fifoTopic)
                .build()) {
                for (int seq = 0; seq < count; seq++) {
                    send(producer, provider.newMessageBuilder().setTopic(normalTopic), "normal", seq);
                    send(producer, provider.newMessageBuilder().setTopic(fifoTopic).setMessageGroup("g" + seq % 2),
                        "fifo", seq);
                }
            }
            consume(provider, conf, opts.get("-g"), normalTopic, "normal", count, deadline);
            consume(provider, conf, opts.get("-G"), fifoTopic, "fifo", count, deadline);
            System.out.println("DONE");
        } catch (Exception e) {
            System.out.println("ERR " + String.valueOf(e).replace("\n", " "));
            System.out.flush();
            System.exit(1);
        }
        System.out.flush();
        // the client's gRPC and scheduler threads are not all daemons
        System.exit(0);
    }

    private static void send(Producer producer, org.apache.rocketmq.client.apis.message.MessageBuilder builder,
        String kind, int seq) throws Exception {
        Message message = builder.setKeys(kind + "-" + seq)
            .setBody((kind + ":" + seq).getBytes(StandardCharsets.UTF_8))
            .build();
        SendReceipt receipt = producer.send(message);
        System.out.println("SENT " + kind + " " + seq + " " + receipt.getMessageId());
    }

    private static void consume(ClientServiceProvider provider, ClientConfiguration conf, String group,
        String topic, String kind, int count, long deadline) throws Exception {
        Set<Integer> seen = new HashSet<>();
        try (SimpleConsumer consumer = provider.newSimpleConsumerBuilder()
            .setClientConfiguration(conf)
            .setConsumerGroup(group)
            // long polling: an empty receive returns after this long, not at once
            .setAwaitDuration(Duration.ofSeconds(2))
            .setSubscriptionExpressions(Collections.singletonMap(topic, FilterExpression.SUB_ALL))
            .build()) {
            while (seen.size() < count) {
                if (System.currentTimeMillis() > deadline) {
                    throw new IllegalStateException(kind + ": " + seen.size() + " of " + count + " received");
                }
                List<MessageView> views = consumer.receive(16, Duration.ofSeconds(15));
                for (MessageView view : views) {
                    String body = StandardCharsets.UTF_8.decode(view.getBody()).toString();
                    int seq = Integer.parseInt(body.substring(body.indexOf(':') + 1));
                    System.out.println("GOT " + kind + " " + view.getMessageGroup().orElse("-") + " " + seq + " "
                        + view.getDeliveryAttempt());
                    // a FIFO group's next message is handed out only once this one is acked
                    consumer.ack(view);
                    System.out.println("ACKED " + kind + " " + seq);
                    seen.add(seq);
                }
            }
        }
    }
}
