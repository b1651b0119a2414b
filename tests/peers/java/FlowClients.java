import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStreamWriter;
import java.io.Writer;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;

import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.impl.producer.TopicPublishInfo;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.remoting.protocol.heartbeat.MessageModel;
import org.apache.rocketmq.remoting.protocol.route.BrokerData;
import org.apache.rocketmq.remoting.protocol.route.TopicRouteData;

/**
 * A steady flow through one topic, for failover tests (infra/rocketmq.py's FlowClients): a producer
 * sending a message about every 50 ms and a clustering push consumer, both of Apache RocketMQ's 5.x
 * Java client, each line of what happened appended to one file and flushed at once.
 *
 * <pre>
 * java -cp CLIENT_JARS:OUT FlowClients -n NAMESRV -t TOPIC -o OUTPUT [-g CONSUMER_GROUP] [-i SEND_MS]
 * </pre>
 *
 * Lines: {@code START <wallms>} once both clients run; {@code ACK <seq> <msgId> <brokerName> <wallms>}
 * for every SEND_OK; {@code GOT <seq> <wallms>} for every delivery (duplicates included);
 * {@code ROUTE <wallms> <brokerName>=<masterAddr>,...} whenever the masters the producer would write to
 * change (checked every 250 ms; groups without a master are left out); {@code ERR <wallms> <message>}
 * for every failure, its message with backslashes and line breaks escaped. Message seq numbers start
 * at 0 and are never reused; the body and the key are the seq. SIGTERM stops both clients and exits 0.
 */
public final class FlowClients {
    private static Writer out;
    private static volatile boolean running = true;

    private FlowClients() {
    }

    public static void main(String[] args) throws Exception {
        Map<String, String> opts = new HashMap<>();
        for (int i = 0; i + 1 < args.length; i += 2) {
            opts.put(args[i], args[i + 1]);
        }
        String namesrv = opts.get("-n");
        String topic = opts.get("-t");
        String output = opts.get("-o");
        if (args.length % 2 != 0 || namesrv == null || topic == null || output == null) {
            System.err.println("usage: FlowClients -n NAMESRV -t TOPIC -o OUTPUT [-g CONSUMER_GROUP] [-i SEND_MS]");
            System.exit(2);
        }
        long sendEveryMs = Long.parseLong(opts.getOrDefault("-i", "50"));
        out = new OutputStreamWriter(new FileOutputStream(output, true), StandardCharsets.UTF_8);

        DefaultMQProducer producer = new DefaultMQProducer("flow_producer_" + System.nanoTime());
        producer.setNamesrvAddr(namesrv);
        producer.setInstanceName("flow-producer");
        // a new master shows in the routes within a second, not the default 30 s
        producer.setPollNameServerInterval(1000);
        producer.setSendMsgTimeout(3000);
        producer.setHeartbeatBrokerInterval(1000);
        producer.start();

        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer(opts.getOrDefault("-g", "flow_consumers"));
        consumer.setNamesrvAddr(namesrv);
        consumer.setInstanceName("flow-consumer");
        consumer.setPollNameServerInterval(1000);
        // a first heartbeat that lost the race with start-up's own is retried in a second, not 30 s:
        // until the broker has the subscription it answers every pull "subscription is not latest"
        consumer.setHeartbeatBrokerInterval(1000);
        consumer.setMessageModel(MessageModel.CLUSTERING);
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.subscribe(topic, "*");
        consumer.registerMessageListener((MessageListenerConcurrently) (msgs, context) -> {
            for (MessageExt msg : msgs) {
                line("GOT " + new String(msg.getBody(), StandardCharsets.UTF_8) + " " + System.currentTimeMillis());
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        consumer.start();

        ScheduledExecutorService routes = Executors.newSingleThreadScheduledExecutor();
        String[] lastRoute = {null};
        routes.scheduleWithFixedDelay(() -> {
            try {
                String now = masters(producer, topic);
                if (!now.equals(lastRoute[0])) {
                    lastRoute[0] = now;
                    line("ROUTE " + System.currentTimeMillis() + " " + now);
                }
            } catch (RuntimeException e) {
                error("route: " + e);
            }
        }, 0, 250, TimeUnit.MILLISECONDS);

        CountDownLatch stopped = new CountDownLatch(1);
        Thread main = Thread.currentThread();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            running = false;
            main.interrupt();
            try {
                stopped.await(20, TimeUnit.SECONDS);
            } catch (InterruptedException ignored) {
                // exiting anyway
            }
        }));

        line("START " + System.currentTimeMillis());
        try {
            produce(producer, topic, sendEveryMs);
        } finally {
            routes.shutdownNow();
            consumer.shutdown();
            producer.shutdown();
            synchronized (FlowClients.class) {
                out.close();
            }
            stopped.countDown();
        }
    }

    private static void produce(DefaultMQProducer producer, String topic, long sendEveryMs) {
        long next = System.currentTimeMillis();
        for (long seq = 0; running; seq++) {
            String key = Long.toString(seq);
            try {
                SendResult sent = producer.send(new Message(topic, "", key, key.getBytes(StandardCharsets.UTF_8)));
                if (sent.getSendStatus() == SendStatus.SEND_OK) {
                    line("ACK " + seq + " " + sent.getMsgId() + " " + sent.getMessageQueue().getBrokerName()
                        + " " + System.currentTimeMillis());
                } else {
                    error("send " + seq + ": " + sent.getSendStatus());
                }
            } catch (Exception e) {
                if (!running) {
                    break;
                }
                error("send " + seq + ": " + e);
            }
            next += sendEveryMs;
            long wait = next - System.currentTimeMillis();
            if (wait < 0) {
                next = System.currentTimeMillis();  // behind after a failure: no burst to catch up
            } else {
                try {
                    Thread.sleep(wait);
                } catch (InterruptedException e) {
                    break;
                }
            }
        }
    }

    /** "group=master,..." by group name: the masters the producer's own route table would write to. */
    private static String masters(DefaultMQProducer producer, String topic) {
        TopicPublishInfo info = producer.getDefaultMQProducerImpl().getTopicPublishInfoTable().get(topic);
        TopicRouteData route = info == null ? null : info.getTopicRouteData();
        Map<String, String> byGroup = new TreeMap<>();
        List<BrokerData> groups = route == null ? null : route.getBrokerDatas();
        if (groups != null) {
            for (BrokerData group : groups) {
                String master = group.getBrokerAddrs().get(0L);
                if (master != null) {
                    byGroup.put(group.getBrokerName(), master);
                }
            }
        }
        StringBuilder sb = new StringBuilder();
        for (Map.Entry<String, String> e : byGroup.entrySet()) {
            sb.append(sb.length() == 0 ? "" : ",").append(e.getKey()).append('=').append(e.getValue());
        }
        return sb.toString();
    }

    private static void error(String message) {
        String escaped = message.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r");
        line("ERR " + System.currentTimeMillis() + " " + escaped);
    }

    private static synchronized void line(String text) {
        try {
            out.write(text + "\n");
            out.flush();
        } catch (IOException e) {
            System.err.println("FlowClients: cannot write " + text + ": " + e);
        }
    }
}
