// Written for this project: runs topic-table scenarios through Apache RocketMQ's own RouteInfoManager (the
// 5.x jars on the class path) and writes the topic lists it answers at each step, each as the exact body
// its TopicList encodes to, beside the scenarios, as tests/vectors/topic_list_order.json. From the root:
//   java -cp "build/jvm/rocketmq-5/*" tests/vectors/order/TopicListOrder.java \
//       < tests/vectors/topic_list_order.json > /tmp/t.json && mv /tmp/t.json tests/vectors/topic_list_order.json
// Input: a JSON object whose "scenarios" maps a name to a list of ops; each op a list of strings:
//   ["reg", cluster, broker, addr, topic...]   REGISTER_BROKER of a master with these topics, in this body order
//   ["unreg", cluster, broker, addr]           UNREGISTER_BROKER of that master
//   ["deltopic", topic]                        DELETE_TOPIC_IN_NAMESRV without a cluster
//   ["all"] / ["cluster", name] / ["system"]   the answer of GET_ALL_TOPIC_LIST_FROM_NAMESERVER,
//                                              GET_TOPICS_BY_CLUSTER, GET_SYSTEM_TOPIC_LIST_FROM_NS: its body
// and whose "key_sets" maps a name to steps ("+key" adds, "-key" removes), written out with the orders
// in which a ConcurrentHashMap.newKeySet(), a ConcurrentHashMap(1024) and a HashSet given them iterate.
import com.alibaba.fastjson2.JSON;
import com.alibaba.fastjson2.JSONArray;
import com.alibaba.fastjson2.JSONObject;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.rocketmq.common.MQVersion;
import org.apache.rocketmq.common.namesrv.NamesrvConfig;
import org.apache.rocketmq.namesrv.routeinfo.RouteInfoManager;
import org.apache.rocketmq.remoting.protocol.body.RegisterBrokerBody;

public class TopicListOrder {
    public static void main(String[] args) throws Exception {
        String input = new String(System.in.readAllBytes(), StandardCharsets.UTF_8);
        JSONObject scenarios = JSON.parseObject(input).getJSONObject("scenarios");
        Map<String, List<String>> out = new LinkedHashMap<>();
        for (String name : scenarios.keySet()) {
            RouteInfoManager rim = new RouteInfoManager(new NamesrvConfig(), null);
            List<String> answers = new ArrayList<>();
            long counter = 0;
            for (Object o : scenarios.getJSONArray(name)) {
                JSONArray op = (JSONArray) o;
                String kind = op.getString(0);
                switch (kind) {
                    case "reg": {
                        StringBuilder table = new StringBuilder();
                        for (int i = 4; i < op.size(); i++) {
                            String t = op.getString(i);
                            if (table.length() > 0) table.append(',');
                            table.append(JSON.toJSONString(t)).append(":{\"attributes\":{},\"order\":false,\"perm\":6,"
                                + "\"readQueueNums\":4,\"topicFilterType\":\"SINGLE_TAG\",\"topicName\":")
                                .append(JSON.toJSONString(t)).append(",\"topicSysFlag\":0,\"writeQueueNums\":4}");
                        }
                        counter++;
                        String body = "{\"filterServerList\":[],\"topicConfigSerializeWrapper\":{\"dataVersion\":"
                            + "{\"counter\":" + counter + ",\"stateVersion\":0,\"timestamp\":1700000000000},"
                            + "\"topicConfigTable\":{" + table + "}}}";
                        RegisterBrokerBody rb = RegisterBrokerBody.decode(body.getBytes(StandardCharsets.UTF_8), false,
                            MQVersion.Version.V5_5_0);
                        rim.registerBroker(op.getString(1), op.getString(3), op.getString(2), 0L, op.getString(3), null,
                            null, rb.getTopicConfigSerializeWrapper(), rb.getFilterServerList(), null);
                        break;
                    }
                    case "unreg":
                        rim.unregisterBroker(op.getString(1), op.getString(3), op.getString(2), 0L);
                        break;
                    case "deltopic":
                        rim.deleteTopic(op.getString(1));
                        break;
                    case "all":
                        answers.add(new String(rim.getAllTopicList().encode(), StandardCharsets.UTF_8));
                        break;
                    case "cluster":
                        answers.add(new String(rim.getTopicsByCluster(op.getString(1)).encode(), StandardCharsets.UTF_8));
                        break;
                    case "system":
                        answers.add(new String(rim.getSystemTopicList().encode(), StandardCharsets.UTF_8));
                        break;
                    default:
                        throw new IllegalArgumentException(kind);
                }
            }
            out.put(name, answers);
        }
        // JDK only: key orders of the maps themselves, for each list of steps ("+key" adds, "-key" removes)
        JSONObject keySets = JSON.parseObject(input).getJSONObject("key_sets");
        Map<String, Map<String, List<String>>> keyOrders = new LinkedHashMap<>();
        for (String name : keySets.keySet()) {
            Set<String> fresh = ConcurrentHashMap.newKeySet();
            Map<String, Boolean> sized = new ConcurrentHashMap<>(1024);
            Set<String> hashSet = new HashSet<>();
            for (Object o : keySets.getJSONArray(name)) {
                String step = (String) o, key = step.substring(1);
                if (step.charAt(0) == '+') {
                    fresh.add(key);
                    sized.put(key, Boolean.TRUE);
                    hashSet.add(key);
                } else {
                    fresh.remove(key);
                    sized.remove(key);
                    hashSet.remove(key);
                }
            }
            Map<String, List<String>> orders = new LinkedHashMap<>();
            orders.put("ConcurrentHashMap.newKeySet()", new ArrayList<>(fresh));
            orders.put("new ConcurrentHashMap<>(1024)", new ArrayList<>(sized.keySet()));
            orders.put("new HashSet<>()", new ArrayList<>(hashSet));
            keyOrders.put(name, orders);
        }
        Map<String, Object> file = new LinkedHashMap<>();
        file.put("derivation", "tests/vectors/order/TopicListOrder.java over Apache RocketMQ "
            + MQVersion.getVersionDesc(MQVersion.CURRENT_VERSION) + "'s RouteInfoManager and TopicList on Java "
            + System.getProperty("java.version"));
        file.put("scenarios", scenarios);
        file.put("answers", out);
        file.put("key_sets", keySets);
        file.put("key_orders", keyOrders);
        System.out.println(JSON.toJSONString(file));
    }
}
