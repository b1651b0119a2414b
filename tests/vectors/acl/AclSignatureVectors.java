// Derives tests/vectors/acl_signatures.json: what Apache RocketMQ's ACL 1.0 client puts in the Signature
// ext field, computed the way its Java code computes it (apache/rocketmq 4.9.8 and 5.3.3, identical here):
//
//   AclClientRPCHook.doBeforeRequest  adds AccessKey (and SecurityToken when set) to the ext fields, then
//   AclClientRPCHook.parseRequestContent  copies the ext fields into a java.util.TreeMap<String, String>,
//   AclUtils.combineRequestContent  appends every value but Signature's, in the map's key order, to a
//       StringBuilder, takes getBytes(UTF-8) and appends the body's bytes,
//   AclSigner.calSignature  HmacSHA1 (javax.crypto.Mac, SecretKeySpec over the secret's UTF-8 bytes),
//       Base64 without line breaks (commons-codec encodeBase64 = java.util.Base64's basic encoder).
//
// The standard-library calls are the ones RocketMQ makes, so TreeMap's UTF-16 key order and String.getBytes'
// handling of lone surrogates are Java's own.  Written for this project, not copied from RocketMQ.
// Regenerate with the JDK (17+), from the repository root:
//
//   java tests/vectors/acl/AclSignatureVectors.java > tests/vectors/acl_signatures.json

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

public class AclSignatureVectors {

    static final class Case {
        final String name;
        final String accessKey;
        final String secretKey;
        final String securityToken;
        final Map<String, String> extFields = new LinkedHashMap<>();
        byte[] body;

        Case(String name, String accessKey, String secretKey, String securityToken) {
            this.name = name;
            this.accessKey = accessKey;
            this.secretKey = secretKey;
            this.securityToken = securityToken;
        }

        Case ext(String key, String value) {
            extFields.put(key, value);
            return this;
        }

        Case body(byte[] body) {
            this.body = body;
            return this;
        }
    }

    public static void main(String[] args) throws Exception {
        List<Case> cases = new ArrayList<>();
        // distribution/conf/plain_acl.yml's account, and what mqadmin updateKvConfig sends (PUT_KV_CONFIG)
        cases.add(new Case("put_kv_config", "RocketMQ", "12345678", null)
            .ext("namespace", "ORDER_TOPIC_CONFIG").ext("key", "TopicTest").ext("value", "broker-a:4"));
        cases.add(new Case("no_ext_fields_no_body", "rocketmq2", "12345678", null));
        cases.add(new Case("security_token", "RocketMQ", "12345678", "token-0001")
            .ext("brokerName", "broker-a"));
        cases.add(new Case("update_namesrv_config_body", "adminKey01", "s3cret-admin-key", null)
            .body("orderMessageEnable=true\n".getBytes(StandardCharsets.UTF_8)));
        // a 5.x broker's REGISTER_BROKER header (values as makeCustomHeaderToNet writes them) and a binary body
        cases.add(new Case("register_broker_binary_body", "brokerAccount", "broker-secret-123", null)
            .ext("brokerName", "broker-a").ext("brokerAddr", "127.0.0.1:10911").ext("clusterName", "DefaultCluster")
            .ext("haServerAddr", "127.0.0.1:10912").ext("brokerId", "0").ext("heartbeatTimeoutMillis", "120000")
            .ext("enableActingMaster", "false").ext("compressed", "true").ext("bodyCrc32", "1733174871")
            .ext("__ZONE_NAME", "zone-1")
            .body(new byte[] {(byte) 0x78, (byte) 0x9c, 0x00, (byte) 0xff, (byte) 0x80, 0x7f, 0x01}));
        // key order: upper case before '_' before lower case, as UTF-16 code units compare
        cases.add(new Case("key_order_ascii", "RocketMQ", "12345678", null)
            .ext("zeta", "1").ext("Zeta", "2").ext("_under", "3").ext("alpha", "4").ext("Alpha", "5")
            .ext("a", "6").ext("aa", "7").ext("A1", "8"));
        // U+FB01 sorts after U+1F600 in UTF-16 (0xFB01 > 0xD83D) but before it by code point
        cases.add(new Case("key_order_supplementary", "RocketMQ", "12345678", null)
            .ext("\uFB01", "ligature").ext("\uD83D\uDE00", "emoji").ext("\u00E9", "e-acute"));
        cases.add(new Case("non_ascii_values_and_secret", "RocketMQ", "\u5BC6\u94A5-secret", null)
            .ext("topic", "\u4E3B\u9898-\uD83D\uDE80").ext("cluster", "caf\u00E9"));
        // String.getBytes(UTF_8) writes a lone surrogate as '?'
        cases.add(new Case("lone_surrogate_value", "RocketMQ", "12345678", null).ext("key", "a\uD800b"));
        // a request that already carries a Signature (a retry): it is replaced, and never signed itself
        cases.add(new Case("stale_signature_replaced", "RocketMQ", "12345678", null)
            .ext("topic", "TopicTest").ext("Signature", "c3RhbGU="));
        // what the C++ and Node.js clients add besides the header's own fields
        cases.add(new Case("ons_channel_field", "RocketMQ", "12345678", null)
            .ext("topic", "TopicTest").ext("OnsChannel", "ALIYUN"));
        cases.add(new Case("empty_value", "RocketMQ", "12345678", null)
            .ext("namespace", "NS").ext("key", ""));

        StringBuilder out = new StringBuilder();
        out.append("{\n  \"derivation\": \"tests/vectors/acl/AclSignatureVectors.java, following AclClientRPCHook,"
            + " AclUtils.combineRequestContent and AclSigner (apache/rocketmq 4.9.8, 5.3.3) with the JDK's TreeMap,"
            + " String.getBytes(UTF_8), Mac HmacSHA1 and Base64\",\n  \"java\": ")
            .append(quote(System.getProperty("java.version"))).append(",\n  \"cases\": [\n");
        for (int i = 0; i < cases.size(); i++) {
            Case c = cases.get(i);
            Map<String, String> fields = new LinkedHashMap<>(c.extFields);
            fields.put("AccessKey", c.accessKey);
            if (c.securityToken != null) {
                fields.put("SecurityToken", c.securityToken);
            }
            TreeMap<String, String> sorted = new TreeMap<>(fields);
            StringBuilder sb = new StringBuilder();
            for (Map.Entry<String, String> e : sorted.entrySet()) {
                if (!"Signature".equals(e.getKey())) {
                    sb.append(e.getValue());
                }
            }
            byte[] head = sb.toString().getBytes(StandardCharsets.UTF_8);
            byte[] body = c.body == null ? new byte[0] : c.body;
            byte[] content = new byte[head.length + body.length];
            System.arraycopy(head, 0, content, 0, head.length);
            System.arraycopy(body, 0, content, head.length, body.length);
            Mac mac = Mac.getInstance("HmacSHA1");
            mac.init(new SecretKeySpec(c.secretKey.getBytes(StandardCharsets.UTF_8), "HmacSHA1"));
            String signature = Base64.getEncoder().encodeToString(mac.doFinal(content));

            out.append("    {\"name\": ").append(quote(c.name))
                .append(", \"accessKey\": ").append(quote(c.accessKey))
                .append(", \"secretKey\": ").append(quote(c.secretKey))
                .append(", \"securityToken\": ").append(c.securityToken == null ? "null" : quote(c.securityToken))
                .append(",\n     \"extFields\": {");
            int n = 0;
            for (Map.Entry<String, String> e : c.extFields.entrySet()) {
                out.append(n++ == 0 ? "" : ", ").append(quote(e.getKey())).append(": ").append(quote(e.getValue()));
            }
            out.append("},\n     \"body_hex\": ").append(c.body == null ? "null" : quote(hex(c.body)))
                .append(",\n     \"sorted_keys\": [");
            n = 0;
            for (String key : sorted.keySet()) {
                out.append(n++ == 0 ? "" : ", ").append(quote(key));
            }
            out.append("],\n     \"content_hex\": ").append(quote(hex(content)))
                .append(",\n     \"signature\": ").append(quote(signature))
                .append("}").append(i + 1 < cases.size() ? ",\n" : "\n");
        }
        out.append("  ]\n}\n");
        System.out.print(out);
    }

    static String hex(byte[] bytes) {
        StringBuilder sb = new StringBuilder();
        for (byte b : bytes) {
            sb.append(String.format("%02x", b & 0xff));
        }
        return sb.toString();
    }

    // JSON string with everything outside printable ASCII as \\uXXXX UTF-16 code units (lone surrogates too)
    static String quote(String s) {
        StringBuilder sb = new StringBuilder("\"");
        for (char ch : s.toCharArray()) {
            if (ch == '"' || ch == '\\') {
                sb.append('\\').append(ch);
            } else if (ch < 0x20 || ch > 0x7e) {
                sb.append(String.format("\\u%04x", (int) ch));
            } else {
                sb.append(ch);
            }
        }
        return sb.append('"').toString();
    }
}
