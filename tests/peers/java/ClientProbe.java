import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * Apache RocketMQ's own Java client (4.9.8 or 5.5.0, whichever jars are on the class path) producing
 * or consuming through one name server, for tests/integration/test_rocketmq_real.py.
 *
 * <pre>
 * java -cp CLIENT_JARS:OUT ClientProbe produce --namesrv HOST:PORT --topic T --count N [--group G]
 * java -cp CLIENT_JARS:OUT ClientProbe consume --namesrv HOST:PORT --topic T --count N [--group G] [--timeout-ms MS]
 * </pre>
 *
 * Bodies are "&lt;topic&gt;-&lt;i&gt;" for i in 0..N-1. Prints one JSON line on stdout: produce lists every
 * send (body, status, broker, queue); consume lists every distinct body it read (all queues of the
 * topic, from the first offset, until it has N or the time is up). Exit 0 when everything arrived or
 * was sent, 1 otherwise, 2 on bad arguments.
 */
public final class ClientProbe {
    private ClientProbe() {
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 1 || args.length % 2 != 1) {
            usage();
        }
        Map<String, String> opts = new HashMap<>();
        for (int i = 1; i < args.length; i += 2) {
            opts.put(args[i], args[i + 1]);
        }
        String namesrv = opts.get("--namesrv");
        String topic = opts.get("--topic");
        String count = opts.get("--count");
        if (namesrv == null || topic == null || count == null) {
            usage();
        }
        int n = Integer.parseInt(count);
        String group = opts.getOrDefault("--group", "probe_" + args[0] + "_" + System.nanoTime());
        boolean ok;
        switch (args[0]) {
            case "produce":
                ok = produce(namesrv, topic, n, group);
                break;
            case "consume":
                ok = consume(namesrv, topic, n, group, Long.parseLong(opts.getOrDefault("--timeout-ms", "60000")));
                break;
            default:
                usage();
                return;
        }
        System.out.flush();
        // the client's own non-daemon threads can outlive shutdown(); the answer is already printed
        Runtime.getRuntime().halt(ok ? 0 : 1);
    }

    private static void usage() {
        System.err.println("usage: ClientProbe produce|consume --namesrv HOST:PORT --topic T --count N"
            + " [--group G] [--timeout-ms MS]");
        Runtime.getRuntime().halt(2);
    }

    private static boolean produce(String namesrv, String topic, int n, String group) throws Exception {
        DefaultMQProducer producer = new DefaultMQProducer(group);
        producer.setNamesrvAddr(namesrv);
        producer.setSendMsgTimeout(10000);
        producer.setRetryTimesWhenSendFailed(0);
        producer.start();
        StringBuilder sends = new StringBuilder();
        boolean ok = true;
        try {
            for (int i = 0; i < n; i++) {
                String body = topic + "-" + i;
                SendResult result = producer.send(new Message(topic, "probe", body.getBytes(StandardCharsets.UTF_8)));
                ok &= result.getSendStatus() == SendStatus.SEND_OK;
                MessageQueue mq = result.getMessageQueue();
                sends.append(i == 0 ? "" : ",")
                    .append("{\"body\":").append(quote(body))
                    .append(",\"status\":").append(quote(String.valueOf(result.getSendStatus())))
                    .append(",\"broker\":").append(quote(mq.getBrokerName()))
                    .append(",\"queue\":").append(mq.getQueueId())
                    .append(",\"msgId\":").append(quote(result.getMsgId())).append('}');
            }
        } catch (Exception e) {
            System.out.println("{\"ok\":false,\"error\":" + quote(e.toString()) + ",\"sent\":[" + sends + "]}");
            return false;
        } finally {
            producer.shutdown();
        }
        System.out.println("{\"ok\":" + ok + ",\"sent\":[" + sends + "]}");
        return ok;
    }

    private static boolean consume(String namesrv, String topic, int n, String group, long timeoutMs)
        throws Exception {
        DefaultLitePullConsumer consumer = new DefaultLitePullConsumer(group);
        consumer.setNamesrvAddr(namesrv);
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.setAutoCommit(false);
        Set<String> bodies = new LinkedHashSet<>();
        List<String> queues = new ArrayList<>();
        long deadline = System.currentTimeMillis() + timeoutMs;
        try {
            consumer.start();
            // the route comes from the name server given here, and so do the brokers' addresses
            Collection<MessageQueue> mqs = consumer.fetchMessageQueues(topic);
            for (MessageQueue mq : mqs) {
                queues.add(mq.getBrokerName() + ":" + mq.getQueueId());
            }
            consumer.assign(mqs);
            while (bodies.size() < n && System.currentTimeMillis() < deadline) {
                for (MessageExt m : consumer.poll(500)) {
                    bodies.add(new String(m.getBody(), StandardCharsets.UTF_8));
                }
            }
        } catch (Exception e) {
            System.out.println("{\"ok\":false,\"error\":" + quote(e.toString()) + ",\"bodies\":" + array(bodies)
                + ",\"queues\":" + array(queues) + "}");
            return false;
        } finally {
            consumer.shutdown();
        }
        boolean ok = bodies.size() >= n;
        System.out.println("{\"ok\":" + ok + ",\"bodies\":" + array(bodies) + ",\"queues\":" + array(queues) + "}");
        return ok;
    }

    private static String array(Collection<String> items) {
        StringBuilder out = new StringBuilder("[");
        for (String item : items) {
            out.append(out.length() == 1 ? "" : ",").append(quote(item));
        }
        return out.append(']').toString();
    }

    private static String quote(String s) {
        if (s == null) {
            return "null";
        }
        StringBuilder out = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') {
                out.append('\\').append(c);
            } else if (c < 0x20) {
                out.append(String.format("\\u%04x", (int) c));
            } else {
                out.append(c);
            }
        }
        return out.append('"').toString();
    }
}
