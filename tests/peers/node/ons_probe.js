#!/usr/bin/env node
'use strict';

// Talks to a name server through ali-ons' own remoting client (MQClientAPI), so what it proves is
// that a real third-party client (header version 121, JSON headers, body parsed by JSON2) can use
// our answers.  Prints one JSON line on stdout; exits 1 when a step fails, 2 on bad arguments.
//
//   node ons_probe.js --namesrv 127.0.0.1:9876 --topic TopicTest \
//        [--namespace NS --key K --value V] [--steps route,kv,cluster] [--timeout-ms 3000] \
//        [--access-key AK --secret-key SK]   (or ROCKETMQ_ACCESS_KEY / ROCKETMQ_SECRET_KEY: signed requests)

const path = require('path');
const { parseArgs } = require('util');

const ONS_LIB = path.join(__dirname, 'node_modules', 'ali-ons', 'lib');

function loadOns() {
  try {
    return {
      MQClientAPI: require(path.join(ONS_LIB, 'mq_client_api')),
      RemotingCommand: require(path.join(ONS_LIB, 'protocol', 'command', 'remoting_command')),
      RequestCode: require(path.join(ONS_LIB, 'protocol', 'request_code')),
      ResponseCode: require(path.join(ONS_LIB, 'protocol', 'response_code')),
      // ali-ons parses name-server bodies with JSON2 because they may be fastjson's legacy dialect
      // (bare integer keys); use the same parser so the probe accepts exactly what the client does.
      JSON2: require(require.resolve('JSON2', { paths: [ path.join(__dirname, 'node_modules', 'ali-ons') ] })),
      version: require(path.join(__dirname, 'node_modules', 'ali-ons', 'package.json')).version,
    };
  } catch (err) {
    fail(2, 'load', `ali-ons is not installed next to this script (${err.message}); run tests/peers/install.sh`);
  }
}

const ALL_STEPS = [ 'route', 'kv', 'cluster' ];

function parseCli(argv) {
  const { values } = parseArgs({
    args: argv,
    options: {
      namesrv: { type: 'string' },
      topic: { type: 'string', default: 'TopicTest' },
      namespace: { type: 'string', default: 'PEER_PROBE' },
      key: { type: 'string', default: 'probeKey' },
      value: { type: 'string', default: 'probeValue' },
      steps: { type: 'string', default: ALL_STEPS.join(',') },
      'timeout-ms': { type: 'string', default: '3000' },
      verbose: { type: 'boolean', default: false },
      // sign every request with ali-ons' own signer (Channel#beforeRequest); the secret may come from the
      // environment instead, which keeps it out of the process list
      'access-key': { type: 'string', default: process.env.ROCKETMQ_ACCESS_KEY || '' },
      'secret-key': { type: 'string', default: process.env.ROCKETMQ_SECRET_KEY || '' },
    },
  });
  if (!values.namesrv || !/^[^:]+:\d+$/.test(values.namesrv)) {
    fail(2, 'args', '--namesrv HOST:PORT is required');
  }
  const steps = values.steps.split(',').filter(Boolean);
  const unknown = steps.filter(s => !ALL_STEPS.includes(s));
  if (unknown.length) {
    fail(2, 'args', `unknown --steps ${unknown.join(',')}; choose from ${ALL_STEPS.join(',')}`);
  }
  const timeoutMs = Number(values['timeout-ms']);
  if (!(timeoutMs > 0)) {
    fail(2, 'args', '--timeout-ms must be a positive number');
  }
  return { ...values, steps, timeoutMs };
}

function fail(exitCode, step, message, extra) {
  process.stdout.write(JSON.stringify({ ok: false, step, error: message, ...extra }) + '\n');
  process.exit(exitCode);
}

class StepError extends Error {
  constructor(step, response, message) {
    super(message || (response && response.remark) || `step ${step} failed`);
    this.step = step;
    this.code = response ? response.code : undefined;
    this.remark = response ? response.remark : undefined;
  }
}

function quietLogger(verbose) {
  const toStderr = (...args) => { if (verbose) console.error(...args); };
  return { info: toStderr, debug: toStderr, warn: toStderr, error: toStderr };
}

async function call(ons, api, code, header, timeoutMs) {
  const request = ons.RemotingCommand.createRequestCommand(code, header);
  return api.invokeForNameSrvAtLeastOnce(request, timeoutMs);
}

async function routeStep(ons, api, opts) {
  try {
    // the method ali-ons' producer and consumer use to refresh routes
    const route = await api.getTopicRouteInfoFromNameServer(opts.topic, opts.timeoutMs);
    if (!route) throw new StepError('route', null, 'SUCCESS without a body');
    return route;
  } catch (err) {
    if (err instanceof StepError) throw err;
    const wrapped = new StepError('route', null, err.message);
    wrapped.code = typeof err.code === 'number' ? err.code : undefined;
    wrapped.remark = err.name === 'MQClientException' ? err.message : undefined;
    throw wrapped;
  }
}

async function kvStep(ons, api, opts) {
  const rc = ons.RequestCode;
  const ok = ons.ResponseCode.SUCCESS;
  const id = { namespace: opts.namespace, key: opts.key };

  const put = await call(ons, api, rc.PUT_KV_CONFIG, { ...id, value: opts.value }, opts.timeoutMs);
  if (put.code !== ok) throw new StepError('kv.put', put);

  const got = await call(ons, api, rc.GET_KV_CONFIG, id, opts.timeoutMs);
  if (got.code !== ok) throw new StepError('kv.get', got);
  const value = got.decodeCommandCustomHeader().value;
  if (value !== opts.value) {
    throw new StepError('kv.get', got, `GET_KV_CONFIG returned ${JSON.stringify(value)}, put ${JSON.stringify(opts.value)}`);
  }

  const del = await call(ons, api, rc.DELETE_KV_CONFIG, id, opts.timeoutMs);
  if (del.code !== ok) throw new StepError('kv.delete', del);

  // after a delete the name server must answer QUERY_NOT_FOUND (22), not an empty value
  const after = await call(ons, api, rc.GET_KV_CONFIG, id, opts.timeoutMs);
  if (after.code === ok) {
    throw new StepError('kv.get_after_delete', after, 'key still readable after DELETE_KV_CONFIG');
  }
  return { put: put.code, get: value, delete: del.code, get_after_delete: { code: after.code, remark: after.remark } };
}

async function clusterStep(ons, api, opts) {
  const response = await call(ons, api, ons.RequestCode.GET_BROKER_CLUSTER_INFO, null, opts.timeoutMs);
  if (response.code !== ons.ResponseCode.SUCCESS) throw new StepError('cluster', response);
  if (!response.body) throw new StepError('cluster', response, 'SUCCESS without a body');
  return ons.JSON2.parse(response.body.toString());
}

async function main() {
  const opts = parseCli(process.argv.slice(2));
  const ons = loadOns();
  const api = new ons.MQClientAPI({
    nameSrv: opts.namesrv,
    // required by the constructor, used only to look the name server up over HTTP (not with nameSrv)
    httpclient: {},
    logger: quietLogger(opts.verbose),
    responseTimeout: opts.timeoutMs,
    connectTimeout: opts.timeoutMs,
    // ali-ons signs only when both are set (its Aliyun names accessKeyId/accessKeySecret are aliases)
    accessKey: opts['access-key'] || undefined,
    secretKey: opts['secret-key'] || undefined,
  });
  // channel errors (refused connection, reset) also reject the pending call; this keeps them from
  // surfacing a second time as an unhandled 'error' event
  api.on('error', err => { if (opts.verbose) console.error(err); });

  const started = Date.now();
  // an explicit opaque: the default one would consume ali-ons' process-wide request counter
  const sample = new ons.RemotingCommand({ code: 0, opaque: -1 });
  const out = {
    ok: true,
    namesrv: opts.namesrv,
    client: { name: 'ali-ons', version: ons.version, header_version: sample.version, language: sample.language },
    signed: Boolean(opts['access-key'] && opts['secret-key']),
  };
  let exitCode = 0;
  try {
    await api.ready();
    if (opts.steps.includes('route')) out.route = await routeStep(ons, api, opts);
    if (opts.steps.includes('kv')) out.kv = await kvStep(ons, api, opts);
    if (opts.steps.includes('cluster')) out.cluster = await clusterStep(ons, api, opts);
  } catch (err) {
    exitCode = 1;
    out.ok = false;
    out.step = err.step || 'connect';
    out.error = err.message;
    if (err.code !== undefined) out.code = err.code;
  } finally {
    out.elapsed_ms = Date.now() - started;
    try { await api.close(); } catch (_) { /* already broken; the result is what matters */ }
  }
  process.stdout.write(JSON.stringify(out) + '\n');
  process.exit(exitCode);
}

main().catch(err => fail(1, 'internal', err.stack || String(err)));
