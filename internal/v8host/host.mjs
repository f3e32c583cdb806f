// Sluice's proxy-wasm host on V8 (Node.js): the plugin run the way Envoy
// runs it on its default engine. It implements what Envoy's Wasm host
// library (proxy-wasm-cpp-host, the commits Envoy 1.33 to 1.38 pin:
// c4d7bb0 and beb8a4e) and Envoy's source/extensions/common/wasm/context.cc
// (envoyproxy/envoy b40935a) do, for what the plugin uses: the same import
// set, status codes, allow-lists, context and stream lifecycle. Comments
// name the source of each behaviour; "cpp-host" means proxy-wasm-cpp-host
// at beb8a4e unless a commit is named.
//
// A proxy is one Envoy: several worker VMs (instances of one module)
// that share shared data and metrics, as Envoy's workers do. One Node
// process runs every proxy of the Go process that started it, so that V8
// compiles a module once. The Go driver (v8host.go) talks to it in JSON
// lines on stdin/stdout: requests {"id", "op", "proxy", ...} get {"id",
// "res"} or {"id", "error"}; logs and VM failures arrive as events {"ev",
// "proxy", ...}. The process ends when its input does.

import { createInterface } from 'node:readline';
import http from 'node:http';
import { getRandomValues, randomUUID } from 'node:crypto';
import { performance } from 'node:perf_hooks';

// proxy-wasm-cpp-sdk proxy_wasm_common.h (the enums cpp-host includes).
const Ok = 0, NotFound = 1, BadArgument = 2, SerializationFailure = 3, InvalidMemoryAccess = 6,
  CasMismatch = 8, BrokenConnection = 11, Unimplemented = 12;
const HeaderMapMax = 7, BufferTypeMax = 8, StreamTypeMax = 3, LogLevelMax = 5, MetricTypeMax = 2;
const MapRequestHeaders = 0, MapResponseHeaders = 2, MapCallHeaders = 6;
const BufRequestBody = 0, BufResponseBody = 1, BufCallBody = 4, BufVMConfig = 6, BufPluginConfig = 7;
// FilterHeadersStatus (cpp-host include/proxy-wasm/context_interface.h).
const HeadersContinue = 0, HeadersStopIteration = 1, HeadersContinueAndEndStream = 2,
  HeadersStopAllIterationAndWatermark = 4;
// FilterDataStatus.
const DataContinue = 0, DataStopIterationNoBuffer = 3;
const LogTrace = 0, LogInfo = 2, LogError = 4;

// WASI errno values cpp-host src/exports.cc returns.
const ESUCCESS = 0, EBADF = 8, EFAULT = 21, EINVAL = 28, ENOENT = 44, ENOSYS = 52, ENOTSUP = 58;
// include/proxy-wasm/limits.h
const RandomGetMax = 64 * 1024, PairsMaxBytes = 1024 * 1024, PairsMaxCount = 1024;

// Allow-lists of cpp-host: host calls a module may make while the host runs
// _initialize/main (src/wasm.cc WasmBase::startVm; beb8a4e adds
// env.emscripten_notify_memory_growth, c4d7bb0 does not: the stricter list
// is kept), and while the host runs its allocator for a host call
// (include/proxy-wasm/wasm.h WasmBase::allocMemory). Any other host call
// there traps with "restricted_callback" (src/v8/v8.cc).
const wasi = (names) => names.flatMap((n) => [`wasi_unstable.${n}`, `wasi_snapshot_preview1.${n}`]);
const StartAllowed = new Set(['env.proxy_log', ...wasi(['fd_write', 'args_sizes_get', 'args_get',
  'environ_sizes_get', 'environ_get', 'fd_prestat_get', 'fd_prestat_dir_name', 'clock_time_get',
  'random_get', 'fd_fdstat_get', 'fd_fdstat_set_flags'])]);
const AllocAllowed = new Set(['env.proxy_log', ...wasi(['fd_write', 'clock_time_get'])]);

const enc = new TextEncoder();
const dec = new TextDecoder();

function emit(obj) { process.stdout.write(JSON.stringify(obj) + '\n'); }

// ---------------------------------------------------------------------------
// Module reading: the types of imports and exports, which the JS API does
// not expose, so that a module is refused as cpp-host's V8 link refuses it.

const ValType = { 0x7f: 'i32', 0x7e: 'i64', 0x7d: 'f32', 0x7c: 'f64', 0x70: 'funcref', 0x6f: 'externref' };

function readModule(bytes) {
  let p = 8;
  const u32 = () => {
    let r = 0, shift = 0, b;
    do { b = bytes[p++]; r |= (b & 0x7f) << shift; shift += 7; } while (b & 0x80);
    return r >>> 0;
  };
  const name = () => { const n = u32(); const s = dec.decode(bytes.subarray(p, p + n)); p += n; return s; };
  const limits = () => { const f = bytes[p++]; const min = u32(); const max = (f & 1) ? u32() : undefined; return { min, max }; };
  const types = [], imports = [], funcs = [], exports = new Map();
  while (p < bytes.length) {
    const id = bytes[p++], size = u32(), end = p + size;
    if (id === 1) {
      for (let n = u32(); n > 0; n--) {
        p++; // 0x60
        const params = []; for (let k = u32(); k > 0; k--) params.push(ValType[bytes[p++]] || 'unknown');
        const results = []; for (let k = u32(); k > 0; k--) results.push(ValType[bytes[p++]] || 'unknown');
        types.push({ params, results });
      }
    } else if (id === 2) {
      for (let n = u32(); n > 0; n--) {
        const module = name(), field = name(), kind = bytes[p++];
        const imp = { module, name: field, kind };
        if (kind === 0) { imp.type = types[u32()]; funcs.push(imp.type); }
        else if (kind === 1) { p++; imp.limits = limits(); }
        else if (kind === 2) imp.limits = limits();
        else { p += 2; }
        imports.push(imp);
      }
    } else if (id === 3) {
      for (let n = u32(); n > 0; n--) funcs.push(types[u32()]);
    } else if (id === 7) {
      for (let n = u32(); n > 0; n--) {
        const nm = name(), kind = bytes[p++], idx = u32();
        if (kind === 0) exports.set(nm, funcs[idx]);
      }
    } else if (id === 10) {
      break; // code: nothing after it matters here
    }
    p = end;
  }
  return { imports, exports };
}

const sig = (types) => (types.length === 0 ? 'void' : types.join(' '));

// ---------------------------------------------------------------------------
// The host functions: module "env" of ABI 0.2.x and WASI, each with its
// signature as cpp-host registers it (Word is i32 on wasm32).

const I = 'i32', L = 'i64';
const i32s = (n) => Array(n).fill(I);

function hostFunctionTypes(abi) {
  const t = new Map();
  const env = (name, params, results = [I]) => t.set(`env.${name}`, { params, results });
  // include/proxy-wasm/exports.h FOR_ALL_HOST_FUNCTIONS
  for (const [n, k] of [['log', 3], ['get_status', 3], ['set_property', 4], ['get_property', 4],
    ['send_local_response', 8], ['get_shared_data', 5], ['set_shared_data', 5],
    ['register_shared_queue', 3], ['resolve_shared_queue', 5], ['dequeue_shared_queue', 3],
    ['enqueue_shared_queue', 3], ['get_header_map_value', 5], ['add_header_map_value', 5],
    ['replace_header_map_value', 5], ['remove_header_map_value', 3], ['get_header_map_pairs', 3],
    ['set_header_map_pairs', 3], ['get_header_map_size', 2], ['get_buffer_status', 3],
    ['get_buffer_bytes', 5], ['set_buffer_bytes', 5], ['http_call', 10], ['grpc_call', 12],
    ['grpc_stream', 9], ['grpc_close', 1], ['grpc_cancel', 1], ['grpc_send', 4],
    ['set_tick_period_milliseconds', 1], ['get_current_time_nanoseconds', 1], ['define_metric', 4],
    ['get_metric', 2], ['set_effective_context', 1], ['done', 0], ['call_foreign_function', 6]]) {
    env(`proxy_${n}`, i32s(k));
  }
  env('proxy_increment_metric', [I, L]);
  env('proxy_record_metric', [I, L]);
  // src/wasm.cc WasmBase::registerCallbacks: the ABI-specific functions.
  env('proxy_continue_stream', [I]);
  env('proxy_close_stream', [I]);
  if (abi === '0_2_1') env('proxy_get_log_level', [I]);
  env('emscripten_notify_memory_growth', [I], []);
  env('pthread_equal', [I, I]);
  // FOR_ALL_WASI_FUNCTIONS, in both wasi_unstable and wasi_snapshot_preview1.
  const w = [['fd_write', i32s(4)], ['fd_read', i32s(4)], ['fd_seek', [I, L, I, I]], ['fd_close', [I]],
    ['fd_fdstat_get', i32s(2)], ['fd_fdstat_set_flags', i32s(2)], ['environ_get', i32s(2)],
    ['environ_sizes_get', i32s(2)], ['args_get', i32s(2)], ['args_sizes_get', i32s(2)],
    ['clock_time_get', [I, L, I]], ['random_get', i32s(2)], ['sched_yield', []], ['poll_oneoff', i32s(4)],
    ['proc_exit', [I], []], ['path_open', [I, I, I, I, I, L, L, I, I]], ['fd_prestat_get', i32s(2)],
    ['fd_prestat_dir_name', i32s(3)]];
  for (const [n, params, results = [I]] of w) {
    t.set(`wasi_unstable.${n}`, { params, results });
    t.set(`wasi_snapshot_preview1.${n}`, { params, results });
  }
  return t;
}

// Callbacks the host calls and their signatures (include/proxy-wasm/wasm.h:
// WasmCallWord<n> takes n i32 and returns i32, WasmCallVoid<n> returns nothing).
const moduleFunctionTypes = new Map([
  ['_initialize', [0, false]], ['_start', [0, false]], ['main', [2, true]], ['malloc', [1, true]],
  ['proxy_on_memory_allocate', [1, true]], ['proxy_validate_configuration', [2, true]],
  ['proxy_on_vm_start', [2, true]], ['proxy_on_configure', [2, true]], ['proxy_on_tick', [1, false]],
  ['proxy_on_context_create', [2, false]], ['proxy_on_request_headers', [3, true]],
  ['proxy_on_request_body', [3, true]], ['proxy_on_request_trailers', [2, true]],
  ['proxy_on_response_headers', [3, true]], ['proxy_on_response_body', [3, true]],
  ['proxy_on_response_trailers', [2, true]], ['proxy_on_http_call_response', [5, false]],
  ['proxy_on_done', [1, true]], ['proxy_on_log', [1, false]], ['proxy_on_delete', [1, false]],
]);

// ---------------------------------------------------------------------------
// Header maps: arrays of [name, value]; names lower-case as Envoy's
// Http::LowerCaseString makes them.

const lower = (s) => s.toLowerCase();
function mapGet(m, key) { for (const kv of m) if (kv[0] === key) return kv[1]; return undefined; }
function mapRemove(m, key) { for (let i = m.length - 1; i >= 0; i--) if (m[i][0] === key) m.splice(i, 1); }

// cpp-host src/pairs_util.cc PairsUtil::pairsSize / marshalPairs / toPairs.
function marshalPairs(pairs) {
  const enc2 = pairs.map(([k, v]) => [enc.encode(k), enc.encode(v)]);
  let size = 4;
  for (const [k, v] of enc2) size += 8 + k.length + 1 + v.length + 1;
  const out = new Uint8Array(size);
  const dv = new DataView(out.buffer);
  dv.setUint32(0, enc2.length, true);
  let p = 4;
  for (const [k, v] of enc2) { dv.setUint32(p, k.length, true); dv.setUint32(p + 4, v.length, true); p += 8; }
  for (const [k, v] of enc2) { out.set(k, p); p += k.length + 1; out.set(v, p); p += v.length + 1; }
  return out;
}

// Malformed input gives no pairs, as in cpp-host.
function toPairs(b) {
  if (b.length > PairsMaxBytes || b.length < 4) return [];
  const dv = new DataView(b.buffer, b.byteOffset, b.byteLength);
  const n = dv.getUint32(0, true);
  if (n > PairsMaxCount || 4 + n * 8 > b.length) return [];
  const sizes = [];
  let p = 4;
  for (let i = 0; i < n; i++) { sizes.push([dv.getUint32(p, true), dv.getUint32(p + 4, true)]); p += 8; }
  const pairs = [];
  for (const [ks, vs] of sizes) {
    if (p + ks + 1 > b.length) return [];
    const k = dec.decode(b.subarray(p, p + ks)); p += ks;
    if (b[p++] !== 0) return [];
    if (p + vs + 1 > b.length) return [];
    const v = dec.decode(b.subarray(p, p + vs)); p += vs;
    if (b[p++] !== 0) return [];
    pairs.push([k, v]);
  }
  return p === b.length ? pairs : [];
}

function le64(n) { const b = new Uint8Array(8); new DataView(b.buffer).setBigUint64(0, BigInt(n), true); return b; }

// ---------------------------------------------------------------------------
// The proxy: options, shared data, metrics, the worker VMs.

class Proxy {
  constructor(id, o) {
    this.id = id;
    this.o = o;
    this.logLevel = o.logLevel;
    this.env = o.env || [];
    this.shared = new Map(); // key → {value, cas}: cpp-host src/shared_data.cc
    this.cas = 1;
    this.metrics = new Map(); // name → {type, value, count}: one Envoy stat per name
    this.vms = [];
    this.next = 0;
    this.agent = new http.Agent({ keepAlive: true });
    this.measure = false;
    this.guestMs = 0;
    this.connectionIds = 0;
  }

  log(vm, level, msg) {
    // ENVOY_LOG drops what is below the logger's level.
    if (level < this.logLevel) return;
    emit({ ev: 'log', proxy: this.id, vm, level, msg });
  }

  stop() {
    for (const vm of this.vms) {
      vm.failed = true; // nothing runs on it any more
      for (const t of vm.timers.values()) clearTimeout(t.handle);
    }
    this.agent.destroy();
  }

  nextCas() { const c = this.cas++; if (this.cas > 0xffffffff) this.cas = 1; return c; }
}

// A context: the VM context (id 0), the root context, or an HTTP stream
// (cpp-host include/proxy-wasm/context.h ContextBase; Envoy Context).
class Context {
  constructor(vm, id, root) {
    this.vm = vm;
    this.id = id;
    this.root = root || this; // root_context(): a root's parent is itself
    this.stream = null; // the filter-manager side of an HTTP stream
    this.inVmContextCreated = false;
    this.requestHeaders = null; // request_headers_: set while the VM may touch them
    this.responseHeaders = null;
    this.accessLog = false;
    this.streamFailed = false;
    this.failureLocalReplySent = false;
    this.destroyed = false;
    // Root contexts: the call-out being delivered and get_status's values.
    this.httpCallResponse = null;
    this.statusCode = 0;
    this.statusMessage = '';
    this.httpRequests = new Map();
    vm.contexts.set(id, this);
  }

  get failed() { return this.vm.failed; }

  // Envoy Context::log: spdlog levels; the plugin's prefix is left out.
  log(level, msg) { this.vm.proxy.log(this.vm.idx, level, msg); return Ok; }
  // Envoy Context::error logs at trace (fd_seek, fd_close, proc_exit).
  error(msg) { this.log(LogTrace, msg); }

  // cpp-host src/context.cc CHECK_FAIL_HTTP: a failed VM answers by the
  // failure policy; fail closed fails the stream once.
  checkFail(open, closed) {
    if (!this.vm.failed) return undefined;
    if (this.vm.proxy.o.failOpen) return open;
    if (!this.streamFailed) {
      this.failStream();
      this.streamFailed = true;
    }
    return closed;
  }

  // Envoy Context::failStream: a 503 local reply with an empty body and
  // details wasm_fail_stream, sent at once (not after the VM call).
  failStream() {
    const s = this.stream;
    if (s && !this.failureLocalReplySent) {
      s.sendLocalReply(503, new Uint8Array(0), [], 'wasm_fail_stream', true);
      this.failureLocalReplySent = true;
    }
  }

  onCreate() {
    if (!this.failed && !this.inVmContextCreated && this.vm.fn.proxy_on_context_create) {
      this.vm.withActions(() => this.vm.call(this, 'proxy_on_context_create', this.id, this.root.id));
    }
    this.inVmContextCreated = true;
  }

  convertHeadersStatus(r) {
    // cpp-host ContextBase::convertVmCallResultToFilterHeadersStatus: a
    // local response stops iteration whatever the plugin returned, and
    // StopIteration becomes StopAllIterationAndWatermark (Envoy's
    // allow_on_headers_stop_iteration defaults to false).
    if (this.vm.stopIteration || r > HeadersStopAllIterationAndWatermark) return HeadersStopAllIterationAndWatermark;
    if (r === HeadersStopIteration) return HeadersStopAllIterationAndWatermark;
    return r;
  }

  onHeaders(name, n, eos) {
    const f = this.checkFail(HeadersContinue, HeadersStopAllIterationAndWatermark);
    if (f !== undefined) return f;
    if (!this.vm.fn[name]) return HeadersContinue;
    return this.vm.withActions(() => {
      const r = this.vm.call(this, name, this.id, n, eos ? 1 : 0);
      const f2 = this.checkFail(HeadersContinue, HeadersStopAllIterationAndWatermark);
      return f2 !== undefined ? f2 : this.convertHeadersStatus(r);
    });
  }

  // Envoy Context::onResponseBody (encodeData): the part is the buffer
  // HttpResponseBody during the call.
  onResponseBody(part, eos) {
    const f = this.checkFail(DataContinue, DataStopIterationNoBuffer);
    if (f !== undefined) return f;
    if (!this.vm.fn.proxy_on_response_body) return DataContinue;
    this.responseBody = part;
    try {
      return this.vm.withActions(() => this.vm.call(this, 'proxy_on_response_body', this.id, part.length, eos ? 1 : 0));
    } finally {
      this.responseBody = null;
    }
  }

  onLog() {
    if (!this.failed && this.vm.fn.proxy_on_log) this.vm.withActions(() => this.vm.call(this, 'proxy_on_log', this.id));
  }

  onDone() {
    if (!this.failed && this.vm.fn.proxy_on_done) return this.vm.withActions(() => this.vm.call(this, 'proxy_on_done', this.id) !== 0);
    return true;
  }

  onDelete() {
    if (this.inVmContextCreated && !this.failed && this.vm.fn.proxy_on_delete) {
      this.vm.withActions(() => this.vm.call(this, 'proxy_on_delete', this.id));
    }
  }

  // Envoy Context::getMap (the maps a plugin may change) and getConstMap.
  getMap(t) {
    if (t === MapRequestHeaders) return this.requestHeaders;
    if (t === MapResponseHeaders) return this.responseHeaders;
    return null; // trailers: the streams here have none
  }

  getConstMap(t) {
    const s = this.stream;
    switch (t) {
      case MapRequestHeaders: return this.accessLog ? s && s.request : this.requestHeaders;
      case MapResponseHeaders: return this.accessLog ? s && s.responseFinal : this.responseHeaders;
      case MapCallHeaders: return this.root.httpCallResponse ? this.root.httpCallResponse.headers : null;
      default: return null;
    }
  }

  // Envoy Context::getBuffer.
  getBuffer(t) {
    switch (t) {
      case BufVMConfig: return this.vm.proxy.vmConfig;
      case BufPluginConfig: return this.vm.tempPlugin ? this.vm.proxy.pluginConfig : null;
      case BufCallBody: return this.root.httpCallResponse ? this.root.httpCallResponse.body : null;
      case BufResponseBody: return this.responseBody || new Uint8Array(0); // the part of the body callback
      case BufRequestBody: case 2: case 3: case 5: case 8:
        return new Uint8Array(0); // no body data modelled: an empty buffer
      default: return null;
    }
  }

  // Envoy Context::continueStream: deferred until the VM call returns; the
  // request-side maps are no longer the plugin's to touch.
  continueStream(t) {
    const s = this.stream;
    switch (t) {
      case 0: if (s) this.vm.after.push(() => s.continueDecoding()); break;
      case 1: if (s) this.vm.after.push(() => s.continueEncoding()); break;
      case 2: return Ok;
      case 3: return Unimplemented;
      default: return BadArgument;
    }
    this.requestHeaders = null;
    return Ok;
  }

  // Envoy Context::closeStream: a reset, deferred.
  closeStream(t) {
    const s = this.stream;
    if ((t === 0 || t === 1) && s) this.vm.after.push(() => s.reset('wasm_close_stream'));
    return t <= StreamTypeMax ? Ok : BadArgument;
  }

  // Envoy Context::sendLocalResponse: the reply is sent after the VM call
  // returns (addAfterVmCallAction), with the plugin's headers lower-cased.
  sendLocalResponse(code, body, headers, details) {
    const s = this.stream;
    if (s) {
      const hs = headers.map(([k, v]) => [lower(k), v]);
      this.vm.after.push(() => s.sendLocalReply(code, body, hs, details.replace(/\s/g, '_'), false));
    }
    return Ok;
  }

  // Envoy Context::getProperty: NUL-separated segments; the first names a
  // top-level value (a dotted path names nothing).
  getProperty(path) {
    const parts = [];
    let start = 0;
    while (start < path.length) {
      let end = path.indexOf(0, start);
      if (end < 0) end = path.length;
      parts.push(dec.decode(path.subarray(start, end)));
      start = end + 1;
    }
    if (parts.length === 0) return [SerializationFailure];
    const v = this.findValue(parts[0]);
    if (v === undefined) return [NotFound];
    let cur = v;
    for (const part of parts.slice(1)) {
      if (cur === null || typeof cur !== 'object' || cur instanceof Uint8Array) return [NotFound];
      cur = cur[part];
      if (cur === undefined) return [NotFound];
    }
    if (typeof cur === 'string') return [Ok, enc.encode(cur)];
    if (cur instanceof Uint8Array) return [Ok, cur];
    if (typeof cur === 'bigint' || typeof cur === 'number') return [Ok, le64(cur)];
    if (Array.isArray(cur)) return [Ok, marshalPairs(cur)];
    return [SerializationFailure]; // a whole map ("request", "source")
  }

  // Envoy's attributes (source/extensions/filters/common/expr/context.cc)
  // for the values a stream has; a root context has none of the request's.
  findValue(name) {
    const p = this.vm.proxy.o;
    switch (name) {
      case 'plugin_name': return p.pluginName;
      case 'plugin_root_id': return p.rootId;
      case 'plugin_vm_id': return p.vmId;
    }
    const s = this.stream;
    if (!s) return undefined;
    const h = this.requestHeaders || (this.accessLog ? s.request : null);
    switch (name) {
      case 'connection_id': return BigInt(s.connectionId);
      case 'connection': return { id: BigInt(s.connectionId) };
      case 'source': {
        const i = s.req.source.lastIndexOf(':');
        return { address: s.req.source, port: BigInt(i >= 0 ? Number(s.req.source.slice(i + 1)) : 0) };
      }
      case 'request': {
        // Header-backed fields need the request headers, which Envoy only
        // keeps while the filter may still see them.
        const r = { protocol: s.req.protocol || 'HTTP/1.1' };
        if (h) {
          const path = mapGet(h, ':path');
          Object.assign(r, {
            path, url_path: path === undefined ? undefined : path.split('?')[0],
            host: mapGet(h, ':authority'), method: mapGet(h, ':method'), scheme: mapGet(h, ':scheme'),
            id: mapGet(h, 'x-request-id'), referer: mapGet(h, 'referer'), useragent: mapGet(h, 'user-agent'),
            headers: h,
          });
          for (const k of Object.keys(r)) if (r[k] === undefined) delete r[k];
        }
        return r;
      }
      case 'response':
        if (s.responseFinal) return { code: BigInt(Number(mapGet(s.responseFinal, ':status'))) };
        return undefined;
    }
    return undefined;
  }
}

// ---------------------------------------------------------------------------
// One worker VM: an instance of the module, its contexts and its state
// (cpp-host WasmBase), and the host functions bound to it.

class VM {
  constructor(proxy, idx, mod, abi) {
    this.proxy = proxy;
    this.idx = idx;
    this.mod = mod;
    this.abi = abi;
    this.failed = false;
    this.contexts = new Map();
    this.nextContextId = 1; // 0 is the VM context
    this.vmContext = new Context(this, 0, null);
    this.current = null; // current_context_
    this.effective = 0; // effective_context_id_
    this.restricted = false;
    this.allowed = null;
    this.after = []; // after_vm_call_actions_
    this.stopIteration = false;
    this.tempPlugin = false; // temp_plugin_: the plugin configuration is readable
    this.nextHttpCallId = 0; // WasmBase::nextHttpCallId: 4, 8, 12, ...
    this.nextMetricId = [0, 1, 2]; // by MetricType, +4 each
    this.metricIds = new Map();
    this.timers = new Map();
    this.depth = 0;
    this.hostMs = 0;
    this.buf = null;
  }

  fail(msg) {
    if (!this.failed) {
      this.failed = true;
      // cpp-host WasmVm::fail → Envoy logs it at error.
      this.proxy.log(this.idx, LogError, msg);
      emit({ ev: 'fail', proxy: this.proxy.id, vm: this.idx, msg });
      for (const t of this.timers.values()) clearTimeout(t.handle);
    }
  }

  allocContextId() { return this.nextContextId++; }

  // contextOrEffectiveContext() of src/exports.cc.
  ctx() {
    if (this.effective === 0) return this.current;
    return this.contexts.get(this.effective) || this.current;
  }

  // A call into the module: cpp-host's V8 getModuleFunctionImpl with
  // SaveRestoreContext. A trap fails the VM and the call returns 0.
  call(ctx, name, ...args) {
    const savedCur = this.current, savedEff = this.effective;
    this.current = ctx;
    this.effective = 0;
    const measure = this.proxy.measure && this.depth === 0;
    let t0 = 0;
    if (measure) { t0 = performance.now(); this.hostMs = 0; }
    this.depth++;
    try {
      const r = this.fn[name](...args);
      return r === undefined ? 0 : r >>> 0;
    } catch (e) {
      this.fail(`Function: ${name} failed: Uncaught ${e && e.name ? e.name : 'Error'}: ${e && e.message !== undefined ? e.message : e}`);
      return 0;
    } finally {
      this.depth--;
      this.current = savedCur;
      this.effective = savedEff;
      if (measure) this.proxy.guestMs += performance.now() - t0 - this.hostMs;
    }
  }

  // cpp-host DeferAfterCallActions: after a callback, the stop flag is
  // cleared and the deferred actions run, in order.
  withActions(f) {
    try {
      return f();
    } finally {
      this.stopIteration = false;
      this.runAfter();
    }
  }

  runAfter() {
    while (this.after.length > 0) this.after.shift()();
  }

  setRestricted(on, allowed) { this.restricted = on; this.allowed = allowed || null; }

  // Memory, as cpp-host's V8 getMemory/setMemory/setWord bound-check it.
  mem() {
    const b = this.memory.buffer;
    if (b !== this.buf) { this.buf = b; this.u8 = new Uint8Array(b); this.dv = new DataView(b); }
  }
  getMemory(ptr, size) {
    this.mem();
    if (ptr + size > this.u8.length) return null;
    return this.u8.subarray(ptr, ptr + size);
  }
  setMemory(ptr, bytes) {
    this.mem();
    if (ptr + bytes.length > this.u8.length) return false;
    this.u8.set(bytes, ptr);
    return true;
  }
  setWord(ptr, v) {
    this.mem();
    if (ptr + 4 > this.u8.length) return false;
    this.dv.setUint32(ptr, v >>> 0, true);
    return true;
  }
  setU64(ptr, v) {
    this.mem();
    if (ptr + 8 > this.u8.length) return false;
    this.dv.setBigUint64(ptr, BigInt.asUintN(64, BigInt(v)), true);
    return true;
  }

  // include/proxy-wasm/wasm.h WasmBase::allocMemory: the module's
  // allocator runs on the VM context under the allocation allow-list, and
  // the restriction is lifted afterwards whatever it was before.
  allocMemory(size) {
    if (!this.mallocName) return 0;
    this.setRestricted(true, AllocAllowed);
    const a = this.call(this.vmContext, this.mallocName, size);
    this.setRestricted(false);
    if (a === 0) return 0;
    this.mem();
    return a + size > this.u8.length ? 0 : a;
  }

  // WasmBase::copyToPointerSize.
  copyToPointerSize(bytes, ptrPtr, sizePtr) {
    let ptr = 0;
    if (bytes.length > 0) {
      ptr = this.allocMemory(bytes.length);
      if (ptr === 0) return false;
      this.mem();
      this.u8.set(bytes, ptr);
    }
    return this.setWord(ptrPtr, ptr) && this.setWord(sizePtr, bytes.length);
  }

  // Envoy Wasm::setTimerPeriod and tickHandler: per root context; a period
  // of 0 stops the timer.
  setTimerPeriod(root, ms) {
    const old = this.timers.get(root.id);
    if (old) clearTimeout(old.handle);
    this.timers.delete(root.id);
    if (ms <= 0) return;
    const t = { ms };
    const tick = () => {
      if (!this.fn.proxy_on_tick || this.timers.get(root.id) !== t) return;
      if (!this.failed) this.withActions(() => this.call(root, 'proxy_on_tick', root.id));
      if (this.timers.get(root.id) === t && !this.failed) { t.handle = setTimeout(tick, ms); t.handle.unref(); }
    };
    t.handle = setTimeout(tick, ms);
    t.handle.unref();
    this.timers.set(root.id, t);
  }

  imports() {
    const vm = this;
    const p = this.proxy;
    const m = {};
    const def = (full, f) => {
      const [mod, name] = full.split('.');
      m[mod] = m[mod] || {};
      // cpp-host's V8 host function wrapper: a restricted call traps.
      m[mod][name] = function (...args) {
        if (vm.restricted && !vm.allowed.has(full)) throw new Error('restricted_callback');
        if (p.measure && vm.depth === 1) {
          const t0 = performance.now();
          try { return f(...args); } finally { vm.hostMs += performance.now() - t0; }
        }
        return f(...args);
      };
    };
    const u = (x) => x >>> 0;
    const wasiBoth = (name, f) => { def(`wasi_unstable.${name}`, f); def(`wasi_snapshot_preview1.${name}`, f); };

    // --- env: src/exports.cc, with Envoy's Context deciding.
    def('env.proxy_log', (level, ptr, size) => {
      if (u(level) > LogLevelMax) return BadArgument;
      const msg = vm.getMemory(u(ptr), u(size));
      if (!msg) return InvalidMemoryAccess;
      return vm.ctx().log(u(level), dec.decode(msg));
    });
    def('env.proxy_get_log_level', (ptr) => {
      // Envoy Context::getLogLevel: the proxy's logger level.
      const b = new Uint8Array(4); new DataView(b.buffer).setUint32(0, p.logLevel, true);
      return vm.setMemory(u(ptr), b) ? Ok : InvalidMemoryAccess;
    });
    def('env.proxy_get_current_time_nanoseconds', (ptr) => (vm.setU64(u(ptr), realtimeNs()) ? Ok : InvalidMemoryAccess));
    def('env.proxy_set_tick_period_milliseconds', (ms) => {
      // cpp-host ContextBase::setTimerPeriod: the timer of the root of
      // whatever context calls, so a stream context may set it too.
      vm.setTimerPeriod(vm.ctx().root, u(ms));
      return Ok;
    });
    def('env.proxy_set_effective_context', (id) => {
      if (!vm.contexts.has(u(id))) return BadArgument;
      vm.effective = u(id);
      return Ok;
    });
    def('env.proxy_done', () => NotFound); // only a root context shutting down may call it
    def('env.proxy_get_status', (codePtr, ptrPtr, sizePtr) => {
      const root = vm.ctx().root;
      const b = new Uint8Array(4); new DataView(b.buffer).setUint32(0, root.statusCode, true);
      if (!vm.setMemory(u(codePtr), b)) return InvalidMemoryAccess;
      return vm.copyToPointerSize(enc.encode(root.statusMessage), u(ptrPtr), u(sizePtr)) ? Ok : InvalidMemoryAccess;
    });
    def('env.proxy_get_property', (ptr, size, retPtr, retSize) => {
      const path = vm.getMemory(u(ptr), u(size));
      if (!path) return InvalidMemoryAccess;
      const [st, v] = vm.ctx().getProperty(path.slice());
      if (st !== Ok) return st;
      return vm.copyToPointerSize(v, u(retPtr), u(retSize)) ? Ok : InvalidMemoryAccess;
    });
    def('env.proxy_set_property', (kp, ks, vp, vs) => {
      if (!vm.getMemory(u(kp), u(ks)) || !vm.getMemory(u(vp), u(vs))) return InvalidMemoryAccess;
      return Unimplemented; // filter state is not modelled
    });
    def('env.proxy_send_local_response', (code, dp, ds, bp, bs, hp, hs, _grpc) => {
      const c = vm.ctx();
      const details = vm.getMemory(u(dp), u(ds)), body = vm.getMemory(u(bp), u(bs)), hdrs = vm.getMemory(u(hp), u(hs));
      if (!details || !body || !hdrs) return InvalidMemoryAccess;
      c.sendLocalResponse(u(code), body.slice(), toPairs(hdrs), dec.decode(details));
      vm.stopIteration = true;
      return Ok;
    });
    def('env.proxy_continue_stream', (t) => (u(t) > StreamTypeMax ? BadArgument : vm.ctx().continueStream(u(t))));
    def('env.proxy_close_stream', (t) => (u(t) > StreamTypeMax ? BadArgument : vm.ctx().closeStream(u(t))));
    def('env.proxy_get_shared_data', (kp, ks, retPtr, retSize, casPtr) => {
      const key = vm.getMemory(u(kp), u(ks));
      if (!key) return InvalidMemoryAccess;
      const e = p.shared.get(Buffer.from(key).toString('latin1'));
      if (!e) return NotFound;
      if (!vm.copyToPointerSize(e.value, u(retPtr), u(retSize))) return InvalidMemoryAccess;
      const b = new Uint8Array(4); new DataView(b.buffer).setUint32(0, e.cas, true);
      return vm.setMemory(u(casPtr), b) ? Ok : InvalidMemoryAccess;
    });
    def('env.proxy_set_shared_data', (kp, ks, vp, vs, cas) => {
      const key = vm.getMemory(u(kp), u(ks)), value = vm.getMemory(u(vp), u(vs));
      if (!key || !value) return InvalidMemoryAccess;
      const k = Buffer.from(key).toString('latin1');
      const e = p.shared.get(k);
      if (e && u(cas) !== 0 && u(cas) !== e.cas) return CasMismatch;
      p.shared.set(k, { value: value.slice(), cas: p.nextCas() });
      return Ok;
    });
    // Shared queues and gRPC are not modelled: they exist, so a module
    // importing them loads, and answer Unimplemented.
    for (const n of ['register_shared_queue', 'resolve_shared_queue', 'dequeue_shared_queue', 'enqueue_shared_queue',
      'grpc_call', 'grpc_stream', 'grpc_close', 'grpc_cancel', 'grpc_send']) {
      def(`env.proxy_${n}`, () => Unimplemented);
    }
    def('env.proxy_call_foreign_function', (np, ns, ap, as) => {
      if (!vm.getMemory(u(np), u(ns)) || !vm.getMemory(u(ap), u(as))) return InvalidMemoryAccess;
      return NotFound; // no foreign functions registered
    });

    // Header maps: src/exports.cc checks the type, Envoy's Context decides.
    const key = (kp, ks) => { const k = vm.getMemory(u(kp), u(ks)); return k ? lower(dec.decode(k)) : null; };
    const val = (vp, vs) => { const v = vm.getMemory(u(vp), u(vs)); return v ? dec.decode(v) : null; };
    def('env.proxy_get_header_map_value', (t, kp, ks, retPtr, retSize) => {
      if (u(t) > HeaderMapMax) return BadArgument;
      const k = key(kp, ks);
      if (k === null) return InvalidMemoryAccess;
      const c = vm.ctx();
      const hm = c.getConstMap(u(t));
      if (!hm) return c.accessLog ? NotFound : BadArgument;
      const v = mapGet(hm, k);
      if (v === undefined) return NotFound;
      return vm.copyToPointerSize(enc.encode(v), u(retPtr), u(retSize)) ? Ok : InvalidMemoryAccess;
    });
    def('env.proxy_get_header_map_pairs', (t, retPtr, retSize) => {
      if (u(t) > HeaderMapMax) return BadArgument;
      const hm = vm.ctx().getConstMap(u(t)) || [];
      if (hm.length === 0) return vm.copyToPointerSize(new Uint8Array(0), u(retPtr), u(retSize)) ? Ok : InvalidMemoryAccess;
      return vm.copyToPointerSize(marshalPairs(hm), u(retPtr), u(retSize)) ? Ok : InvalidMemoryAccess;
    });
    def('env.proxy_get_header_map_size', (t, retPtr) => {
      if (u(t) > HeaderMapMax) return BadArgument;
      const hm = vm.ctx().getMap(u(t));
      if (!hm) return BadArgument;
      let n = 0;
      for (const [k, v] of hm) n += enc.encode(k).length + enc.encode(v).length; // HeaderMap::byteSize
      return vm.setWord(u(retPtr), n) ? Ok : InvalidMemoryAccess;
    });
    const mutate = (t, f) => {
      if (u(t) > HeaderMapMax) return BadArgument;
      const hm = vm.ctx().getMap(u(t));
      if (!hm) return BadArgument;
      return f(hm);
    };
    def('env.proxy_add_header_map_value', (t, kp, ks, vp, vs) => {
      const k = key(kp, ks), v = val(vp, vs);
      if (u(t) <= HeaderMapMax && (k === null || v === null)) return InvalidMemoryAccess;
      return mutate(t, (hm) => { hm.push([k, v]); return Ok; });
    });
    def('env.proxy_replace_header_map_value', (t, kp, ks, vp, vs) => {
      const k = key(kp, ks), v = val(vp, vs);
      if (u(t) <= HeaderMapMax && (k === null || v === null)) return InvalidMemoryAccess;
      return mutate(t, (hm) => {
        const i = hm.findIndex((kv) => kv[0] === k);
        if (i < 0) { hm.push([k, v]); return Ok; }
        hm[i] = [k, v];
        for (let j = hm.length - 1; j > i; j--) if (hm[j][0] === k) hm.splice(j, 1);
        return Ok;
      });
    });
    def('env.proxy_remove_header_map_value', (t, kp, ks) => {
      const k = key(kp, ks);
      if (u(t) <= HeaderMapMax && k === null) return InvalidMemoryAccess;
      return mutate(t, (hm) => { mapRemove(hm, k); return Ok; });
    });
    def('env.proxy_set_header_map_pairs', (t, ptr, size) => {
      const b = vm.getMemory(u(ptr), u(size));
      if (u(t) <= HeaderMapMax && !b) return InvalidMemoryAccess;
      return mutate(t, (hm) => { hm.length = 0; for (const [k, v] of toPairs(b)) hm.push([lower(k), v]); return Ok; });
    });

    // Buffers: src/exports.cc get_buffer_bytes / get_buffer_status.
    def('env.proxy_get_buffer_status', (t, lenPtr, flagsPtr) => {
      if (u(t) > BufferTypeMax) return BadArgument;
      const b = vm.ctx().getBuffer(u(t));
      if (!b) return NotFound;
      return vm.setWord(u(lenPtr), b.length) && vm.setWord(u(flagsPtr), 0) ? Ok : InvalidMemoryAccess;
    });
    def('env.proxy_get_buffer_bytes', (t, start, length, retPtr, retSize) => {
      if (u(t) > BufferTypeMax) return BadArgument;
      const b = vm.ctx().getBuffer(u(t));
      if (!b) return NotFound;
      let s = u(start), n = u(length);
      if (s > b.length) n = 0;
      else if (s + n > b.length) n = b.length - s;
      if (n === 0) return vm.setWord(u(retPtr), 0) && vm.setWord(u(retSize), 0) ? Ok : InvalidMemoryAccess;
      return vm.copyToPointerSize(b.subarray(s, s + n), u(retPtr), u(retSize)) ? Ok : InvalidMemoryAccess;
    });
    def('env.proxy_set_buffer_bytes', (t, _s, _l, dp, ds) => {
      if (u(t) > BufferTypeMax) return BadArgument;
      if (!vm.ctx().getBuffer(u(t))) return NotFound;
      if (!vm.getMemory(u(dp), u(ds))) return InvalidMemoryAccess;
      return Unimplemented; // the buffers here are read-only
    });

    def('env.proxy_http_call', (up, us, hp, hs, bp, bs, tp, ts, timeout, tokenPtr) => {
      const root = vm.ctx().root;
      const cluster = vm.getMemory(u(up), u(us)), body = vm.getMemory(u(bp), u(bs));
      const hdrs = vm.getMemory(u(hp), u(hs)), trailers = vm.getMemory(u(tp), u(ts));
      if (!cluster || !body || !hdrs || !trailers) return InvalidMemoryAccess;
      // The token's memory is checked before the call starts.
      if (!vm.setWord(u(tokenPtr), 0)) return InvalidMemoryAccess;
      const r = httpCall(vm, root, dec.decode(cluster), toPairs(hdrs), body.slice(), timeout | 0);
      if (r.status === Ok) vm.setWord(u(tokenPtr), r.token);
      return r.status;
    });

    // Metrics: Envoy Context::defineMetric / incrementMetric / recordMetric /
    // getMetric. Ids are per VM; the stat behind a name is the proxy's.
    def('env.proxy_define_metric', (t, np, ns, idPtr) => {
      const name = vm.getMemory(u(np), u(ns));
      if (!name) return InvalidMemoryAccess;
      if (u(t) > MetricTypeMax) return BadArgument;
      const nm = dec.decode(name);
      let rec = p.metrics.get(nm);
      if (!rec) { rec = { type: u(t), value: 0n, count: 0 }; p.metrics.set(nm, rec); }
      const id = (vm.nextMetricId[u(t)] += 4);
      vm.metricIds.set(id, rec);
      return vm.setWord(u(idPtr), id) ? Ok : InvalidMemoryAccess;
    });
    def('env.proxy_increment_metric', (id, offset) => {
      const type = u(id) & 3, rec = vm.metricIds.get(u(id));
      if (type === 0) {
        if (!rec) return NotFound;
        if (offset <= 0n) return BadArgument;
        rec.value += offset;
        return Ok;
      }
      if (type === 1) {
        if (!rec) return NotFound;
        rec.value += offset;
        return Ok;
      }
      return BadArgument;
    });
    def('env.proxy_record_metric', (id, value) => {
      const type = u(id) & 3, rec = vm.metricIds.get(u(id));
      if (!rec) return NotFound;
      const v = BigInt.asUintN(64, value);
      if (type === 0) rec.value += v;
      else if (type === 1) rec.value = v;
      else if (type === 2) rec.count++;
      else return NotFound;
      return Ok;
    });
    def('env.proxy_get_metric', (id, ptr) => {
      const type = u(id) & 3, rec = vm.metricIds.get(u(id));
      if (type > 1) return BadArgument;
      if (!rec) return NotFound;
      return vm.setU64(u(ptr), rec.value) ? Ok : InvalidMemoryAccess;
    });

    def('env.emscripten_notify_memory_growth', () => undefined);
    def('env.pthread_equal', (a, b) => (a === b ? 1 : 0));

    // --- WASI: src/exports.cc, exactly.
    wasiBoth('fd_write', (fd, iovs, iovsLen, nwrittenPtr) => {
      let level;
      if (fd === 1) level = LogInfo;
      else if (fd === 2) level = LogError;
      else return EBADF;
      const chunks = [];
      let total = 0;
      for (let i = 0; i < u(iovsLen); i++) {
        const iov = vm.getMemory(u(iovs) + i * 8, 8);
        if (!iov) return EFAULT;
        const dv = new DataView(iov.buffer, iov.byteOffset, 8);
        const len = dv.getUint32(4, true);
        if (len !== 0) {
          const b = vm.getMemory(dv.getUint32(0, true), len);
          if (!b) return EFAULT;
          chunks.push(b.slice());
          total += len;
        }
      }
      if (total !== 0) {
        let s = Buffer.concat(chunks);
        if (s[s.length - 1] === 0x0a) s = s.subarray(0, s.length - 1); // one trailing newline
        if (vm.ctx().log(level, dec.decode(s)) !== Ok) return EBADF;
      }
      return vm.setWord(u(nwrittenPtr), total) ? ESUCCESS : EFAULT;
    });
    wasiBoth('fd_read', () => ENOSYS);
    wasiBoth('fd_seek', () => { vm.ctx().error('wasi_unstable fd_seek'); return ESUCCESS; });
    wasiBoth('fd_close', () => { vm.ctx().error('wasi_unstable fd_close'); return ESUCCESS; });
    wasiBoth('fd_fdstat_get', (fd, ptr) => {
      if (fd !== 1 && fd !== 2) return EBADF;
      const b = new Uint8Array(24); new DataView(b.buffer).setBigUint64(8, 64n, true); // FD_WRITE rights
      vm.setMemory(u(ptr), b); // cpp-host ignores a failed write here
      return ESUCCESS;
    });
    wasiBoth('fd_fdstat_set_flags', () => ENOSYS);
    wasiBoth('environ_get', (arrayPtr, bufPtr) => {
      let a = u(arrayPtr), b = u(bufPtr);
      for (const [k, v] of p.env) {
        if (!vm.setWord(a, b)) return EFAULT;
        const data = enc.encode(`${k}=${v}\0`);
        if (!vm.setMemory(b, data)) return EFAULT;
        b += data.length;
        a += 4;
      }
      return ESUCCESS;
    });
    wasiBoth('environ_sizes_get', (countPtr, sizePtr) => {
      if (!vm.setWord(u(countPtr), p.env.length)) return EFAULT;
      let n = 0;
      for (const [k, v] of p.env) n += enc.encode(k).length + enc.encode(v).length + 2;
      return vm.setWord(u(sizePtr), n) ? ESUCCESS : EFAULT;
    });
    wasiBoth('args_get', () => ESUCCESS);
    wasiBoth('args_sizes_get', (argcPtr, sizePtr) => (vm.setWord(u(argcPtr), 0) && vm.setWord(u(sizePtr), 0) ? ESUCCESS : EFAULT));
    wasiBoth('clock_time_get', (id, _precision, ptr) => {
      let t;
      if (id === 0) t = realtimeNs();
      else if (id === 1) t = process.hrtime.bigint();
      else return ENOTSUP; // process and thread CPU clocks are not supported
      return vm.setU64(u(ptr), t) ? ESUCCESS : EFAULT;
    });
    wasiBoth('random_get', (ptr, len) => {
      if (u(len) > RandomGetMax) return EINVAL;
      if (u(len) === 0) return ESUCCESS;
      const b = new Uint8Array(u(len));
      getRandomValues(b);
      return vm.setMemory(u(ptr), b) ? ESUCCESS : EFAULT;
    });
    wasiBoth('sched_yield', () => ESUCCESS);
    wasiBoth('poll_oneoff', () => ENOSYS);
    wasiBoth('proc_exit', () => {
      // cpp-host only logs (Envoy: at trace) and returns, but a guest that
      // called proc_exit has nothing left to run: the VM fails here, as it
      // would at the guest's next instruction.
      vm.ctx().error('wasi_unstable proc_exit');
      throw new Error('proc_exit');
    });
    wasiBoth('path_open', () => ENOENT);
    wasiBoth('fd_prestat_get', () => EBADF);
    wasiBoth('fd_prestat_dir_name', () => ENOSYS);
    return m;
  }
}

function realtimeNs() {
  return BigInt(Math.round((performance.timeOrigin + performance.now()) * 1e6));
}

// ---------------------------------------------------------------------------
// HTTP call-outs: Envoy Context::httpCall and its async client.

const ConnectFailureBody = 'upstream connect error or disconnect/reset before headers. reset reason: remote connection failure, transport failure reason: delayed connect error: 111';
const ResetBeforeHeadersBody = 'upstream connect error or disconnect/reset before headers. reset reason: connection termination';

function httpCall(vm, root, cluster, headers, body, timeoutMs) {
  const p = vm.proxy;
  if (timeoutMs < 0) return { status: BadArgument };
  const base = p.o.clusters[cluster];
  if (base === undefined) return { status: BadArgument }; // no such cluster
  const hs = headers.map(([k, v]) => [lower(k), v]);
  const path = mapGet(hs, ':path'), method = mapGet(hs, ':method'), authority = mapGet(hs, ':authority');
  if (path === undefined || method === undefined || authority === undefined) return { status: BadArgument };
  vm.nextHttpCallId += 4;
  const token = vm.nextHttpCallId;
  const url = new URL(base);
  const out = {};
  for (const [k, v] of hs) {
    if (k.startsWith(':')) continue;
    if (out[k] === undefined) out[k] = v;
    else out[k] = [].concat(out[k], v);
  }
  out.host = authority;
  if (body.length > 0) out['content-length'] = String(body.length);
  const req = http.request({
    agent: p.agent, hostname: url.hostname, port: url.port || 80, method, path, headers: out, setHost: false,
  });
  const handler = { done: false };
  root.httpRequests.set(token, handler);
  let headersSeen = false;
  let timer = null;
  const finish = (f) => {
    if (handler.done) return;
    handler.done = true;
    if (timer) clearTimeout(timer);
    f();
  };
  // The router's own answers reach the plugin as responses (Envoy's async
  // client goes through the router filter): connect failure, reset before
  // headers and timeout are local replies of the router.
  const routerReply = (status, text) => {
    const b = enc.encode(text);
    return { headers: [[':status', String(status)], ['content-length', String(b.length)], ['content-type', 'text/plain']], body: b };
  };
  const max = p.o.maxCalloutBody;
  req.on('response', (res) => {
    headersSeen = true;
    const chunks = [];
    let n = 0;
    res.on('data', (c) => {
      n += c.length;
      if (max > 0 && n > max) {
        // Envoy: ExceedResponseBufferLimit, reported as onFailure.
        finish(() => onHttpCallFailure(vm, root, token));
        req.destroy();
        return;
      }
      chunks.push(c);
    });
    res.on('end', () => {
      const h = [[':status', String(res.statusCode)]];
      for (let i = 0; i < res.rawHeaders.length; i += 2) h.push([lower(res.rawHeaders[i]), res.rawHeaders[i + 1]]);
      finish(() => onHttpCallSuccess(vm, root, token, { headers: h, body: new Uint8Array(Buffer.concat(chunks)) }));
    });
    res.on('aborted', () => finish(() => onHttpCallFailure(vm, root, token)));
    res.on('error', () => finish(() => onHttpCallFailure(vm, root, token)));
  });
  req.on('error', (err) => {
    if (headersSeen) { finish(() => onHttpCallFailure(vm, root, token)); return; }
    const text = err && err.code === 'ECONNREFUSED' ? ConnectFailureBody : ResetBeforeHeadersBody;
    finish(() => onHttpCallSuccess(vm, root, token, routerReply(503, text)));
  });
  if (timeoutMs > 0) {
    timer = setTimeout(() => {
      // The router's timeout: 504 before the response started, a reset after.
      if (headersSeen) finish(() => onHttpCallFailure(vm, root, token));
      else finish(() => onHttpCallSuccess(vm, root, token, routerReply(504, 'upstream request timeout')));
      req.destroy();
    }, timeoutMs);
  }
  req.end(body.length > 0 ? Buffer.from(body) : undefined);
  return { status: Ok, token };
}

// Envoy Context::onHttpCallSuccess: the response is readable during the
// callback (from the root context, also through an effective stream
// context) and dropped after it.
function onHttpCallSuccess(vm, root, token, response) {
  if (!root.httpRequests.has(token)) return;
  root.httpCallResponse = response;
  vm.after.push(() => { root.httpCallResponse = null; root.httpRequests.delete(token); });
  onHttpCallResponse(vm, root, token, response.headers.length, response.body.length, 0);
}

// Envoy Context::onHttpCallFailure: no headers, and get_status gives
// BrokenConnection "reset" during the callback (the code stays).
function onHttpCallFailure(vm, root, token) {
  if (!root.httpRequests.has(token)) return;
  root.statusCode = BrokenConnection;
  root.statusMessage = 'reset';
  vm.after.push(() => { root.statusMessage = ''; root.httpRequests.delete(token); });
  onHttpCallResponse(vm, root, token, 0, 0, 0);
}

// cpp-host ContextBase::onHttpCallResponse.
function onHttpCallResponse(vm, root, token, headers, bodySize, trailers) {
  if (vm.failed || !vm.fn.proxy_on_http_call_response) return;
  vm.withActions(() => vm.call(root, 'proxy_on_http_call_response', root.id, token, headers, bodySize, trailers));
}

// ---------------------------------------------------------------------------
// HTTP streams: Envoy's connection manager and filter manager around the
// plugin's Context, with one filter (the plugin) and an upstream whose
// answer the request carries.

class Stream {
  constructor(vm, req) {
    this.vm = vm;
    this.req = req;
    this.connectionId = ++vm.proxy.connectionIds;
    // Envoy's HTTP/1 codec lower-cases names; the connection manager adds
    // x-request-id (generate_request_id) and x-forwarded-proto when absent
    // (source/common/http/conn_manager_utility.cc).
    const h = [[':authority', req.authority || ''], [':path', req.path], [':method', req.method || 'GET'],
      [':scheme', req.scheme || 'http']];
    for (const [k, v] of req.headers || []) h.push([lower(k), v]);
    if (mapGet(h, 'x-forwarded-proto') === undefined) h.push(['x-forwarded-proto', req.scheme || 'http']);
    if (mapGet(h, 'x-request-id') === undefined) h.push(['x-request-id', req.requestId || randomUUID()]);
    this.request = h;
    this.responseFinal = null;
    this.stopped = false; // decoding stopped by the filter
    this.encodeStopped = false;
    this.responseStarted = false;
    this.result = null;
    this.promise = new Promise((resolve) => { this.resolve = resolve; });
    this.ctx = new Context(vm, vm.allocContextId(), vm.root);
    this.ctx.stream = this;
  }

  finish(result) {
    if (this.result) return;
    this.result = result;
    this.resolve();
  }

  // The filter manager resumes a stopped decoder (continueDecoding); a
  // request not stopped has nothing to resume.
  continueDecoding() {
    if (!this.stopped || this.result || this.responseStarted) return;
    this.stopped = false;
    this.toUpstream();
  }

  continueEncoding() {
    if (!this.encodeStopped || this.result) return;
    this.encodeStopped = false;
    this.finish(this.pendingResult);
  }

  reset(details) {
    this.finish({ reset: true, details });
  }

  // Envoy's local reply (source/common/http/utility.cc sendLocalReply):
  // ":status", the given headers, then content-length and content-type
  // text/plain when the body is not empty (both removed when it is); it
  // runs through the encoder filters, so through the plugin's
  // on_response_headers, unless the stream failed.
  sendLocalReply(code, body, headers, details, failure) {
    if (this.result) return;
    const h = [[':status', String(code)], ...headers];
    if (body.length > 0) {
      const i = h.findIndex((kv) => kv[0] === 'content-length');
      if (i >= 0) h[i] = ['content-length', String(body.length)];
      else h.push(['content-length', String(body.length)]);
      if (mapGet(h, 'content-type') === undefined) h.push(['content-type', 'text/plain']);
    } else {
      mapRemove(h, 'content-length');
      mapRemove(h, 'content-type');
    }
    const result = { status: code, headers: h, body, local: true, details };
    if (this.responseStarted || failure) {
      // A reply once response headers exist goes directly downstream
      // (FilterManager::sendDirectLocalReply), as does the failure reply
      // of a failed VM, which has no plugin to run.
      this.responseFinal = h;
      this.finish(result);
      return;
    }
    this.encode(h, body.length === 0, result);
  }

  // The upstream answers with its status, headers and body parts; headers
  // alone end the stream, else the last part does.
  toUpstream() {
    this.upstreamRequest = this.request.map((kv) => [kv[0], kv[1]]);
    const u = this.req.upstream || { status: 200, headers: [] };
    const h = [[':status', String(u.status)]];
    for (const [k, v] of u.headers || []) h.push([lower(k), v]);
    const parts = (u.body || []).map((b) => enc.encode(b));
    const body = Buffer.concat(parts);
    this.encode(h, parts.length === 0 && !u.cut, { status: u.status, headers: h, body, local: false, details: 'via_upstream' },
      parts, u.cut);
  }

  // Envoy Context::encodeHeaders, then encodeData for each body part
  // (parts), which the plugin reads and lets pass; cut: the last part
  // does not end the stream (the upstream reset it).
  encode(h, eos, result, parts, cut) {
    this.responseStarted = true;
    this.responseFinal = h;
    const c = this.ctx;
    if (!c.inVmContextCreated || c.failureLocalReplySent) { this.finish(result); return; }
    c.responseHeaders = h;
    const r = c.onHeaders('proxy_on_response_headers', h.length, eos);
    if (this.result) return;
    if (r === HeadersContinue || r === HeadersContinueAndEndStream) {
      c.responseHeaders = null;
      for (let i = 0; parts && i < parts.length && !this.result; i++) {
        c.onResponseBody(parts[i], i === parts.length - 1 && !cut);
      }
      this.finish(result);
      return;
    }
    this.pendingResult = result;
    this.encodeStopped = true;
  }

  async run() {
    const c = this.ctx;
    // Envoy Context::decodeHeaders.
    c.onCreate();
    c.requestHeaders = this.request;
    const r = c.onHeaders('proxy_on_request_headers', this.request.length, this.req.endOfStream !== false);
    if (!this.result) {
      if (r === HeadersContinue || r === HeadersContinueAndEndStream) {
        c.requestHeaders = null;
        this.toUpstream();
      } else {
        this.stopped = true;
      }
    }
    await this.promise;
    // source/common/http/conn_manager_impl.cc doDeferredStreamDestroy: the
    // access log (Context::log → proxy_on_log), then the filters' onDestroy
    // (proxy_on_done, proxy_on_delete).
    if (!c.inVmContextCreated) c.onCreate();
    c.accessLog = true;
    c.onLog();
    c.accessLog = false;
    if (!c.destroyed && c.inVmContextCreated) {
      c.destroyed = true;
      c.onDone();
      c.onDelete();
    }
    this.vm.contexts.delete(c.id);
    return this.result;
  }
}

// ---------------------------------------------------------------------------
// Starting the proxy: link, _initialize, root context, vm start, configure.

// Modules by the driver's key, compiled once per process.
const modules = new Map();

function load(key, bytes) {
  const info = readModule(bytes);
  modules.set(key, { info, bytes });
}

function start(id, o) {
  const loaded = modules.get(o.wasmKey);
  if (!loaded) throw new Error(`no module ${o.wasmKey} loaded`);
  const { info, bytes } = loaded;
  const p = new Proxy(id, o);
  p.vmConfig = enc.encode(o.vmConfig || '');
  p.pluginConfig = enc.encode(o.pluginConfig || '');
  // cpp-host BytecodeUtil::getAbiVersion: from the exported marker.
  let abi = null;
  if (info.exports.has('proxy_abi_version_0_2_1')) abi = '0_2_1';
  else if (info.exports.has('proxy_abi_version_0_2_0')) abi = '0_2_0';
  if (!abi) throw new Error('Missing or unknown Proxy-Wasm ABI version (this host runs 0.2.0 and 0.2.1)');
  // cpp-host src/v8/v8.cc V8::link: every function import must be one the
  // host registers, with the same signature.
  const types = hostFunctionTypes(abi);
  for (const imp of info.imports) {
    const full = `${imp.module}.${imp.name}`;
    if (imp.kind === 0) {
      const t = types.get(full);
      if (!t) throw new Error(`Failed to load Wasm module due to a missing import: ${full}`);
      if (sig(t.params) !== sig(imp.type.params) || sig(t.results) !== sig(imp.type.results)) {
        throw new Error(`Failed to load Wasm module due to an import type mismatch: ${full}, want: ` +
          `${sig(imp.type.params)} -> ${sig(imp.type.results)}, but host exports: ${sig(t.params)} -> ${sig(t.results)}`);
      }
    } else if (imp.kind === 3) {
      throw new Error(`Failed to load Wasm module due to a missing import: ${full}`);
    }
  }
  // getModuleFunctionImpl: a callback with the wrong signature is refused.
  for (const [name, [n, ret]] of moduleFunctionTypes) {
    const t = info.exports.get(name);
    if (t && (sig(t.params) !== sig(i32s(n)) || sig(t.results) !== sig(ret ? [I] : []))) {
      throw new Error(`Bad function signature for: ${name}, want: ${sig(i32s(n))} -> ${sig(ret ? [I] : [])}, ` +
        `but the module exports: ${sig(t.params)} -> ${sig(t.results)}`);
    }
  }
  if (!loaded.module) loaded.module = new WebAssembly.Module(bytes);
  const mod = loaded.module;
  try {
    for (let i = 0; i < (o.workers || 1); i++) {
      const vm = new VM(p, i, mod, abi);
      p.vms.push(vm);
      startVM(vm, info, o);
    }
  } catch (e) {
    p.stop(); // the VMs that started stop their timers
    throw e;
  }
  return p;
}

function startVM(vm, info, o) {
  const p = vm.proxy;
  const imports = vm.imports();
  for (const imp of info.imports) {
    // Memory and table imports are created by the host (V8::link).
    if (imp.kind === 2) {
      imports[imp.module] = imports[imp.module] || {};
      imports[imp.module][imp.name] = new WebAssembly.Memory({ initial: imp.limits.min, maximum: imp.limits.max });
    } else if (imp.kind === 1) {
      imports[imp.module] = imports[imp.module] || {};
      imports[imp.module][imp.name] = new WebAssembly.Table({ element: 'anyfunc', initial: imp.limits.min, maximum: imp.limits.max });
    }
  }
  const inst = new WebAssembly.Instance(vm.mod, imports);
  vm.fn = {};
  for (const name of moduleFunctionTypes.keys()) if (typeof inst.exports[name] === 'function') vm.fn[name] = inst.exports[name];
  vm.memory = inst.exports.memory;
  for (const v of Object.values(inst.exports)) if (!vm.memory && v instanceof WebAssembly.Memory) vm.memory = v;
  // src/wasm.cc WasmBase::getFunctions: malloc, else proxy_on_memory_allocate.
  vm.mallocName = vm.fn.malloc ? 'malloc' : vm.fn.proxy_on_memory_allocate ? 'proxy_on_memory_allocate' : null;
  if (!vm.mallocName) throw new Error('Wasm module is missing malloc function.');
  // WasmBase::startVm: _initialize (and main, if exported) or _start, on
  // the VM context, under the start allow-list.
  vm.setRestricted(true, StartAllowed);
  if (vm.fn._initialize) {
    vm.call(vm.vmContext, '_initialize');
    if (vm.fn.main && !vm.failed) vm.call(vm.vmContext, 'main', 0, 0);
  } else if (vm.fn._start) {
    vm.call(vm.vmContext, '_start');
  }
  vm.setRestricted(false);
  if (vm.failed) throw new Error(`vm ${vm.idx} failed to start`);
  // WasmBase::start → ContextBase::onStart: the root context.
  const root = new Context(vm, vm.allocContextId(), null);
  vm.root = root;
  let ok = true;
  vm.withActions(() => {
    if (vm.fn.proxy_on_context_create) {
      vm.tempPlugin = true;
      vm.call(root, 'proxy_on_context_create', root.id, 0);
      vm.tempPlugin = false;
      root.inVmContextCreated = true;
    }
  });
  vm.withActions(() => {
    if (vm.fn.proxy_on_vm_start) ok = vm.call(root, 'proxy_on_vm_start', root.id, p.vmConfig.length) !== 0;
  });
  if (vm.failed) throw new Error(`vm ${vm.idx} failed in proxy_on_vm_start`);
  if (!ok) throw new Error(`vm ${vm.idx}: proxy_on_vm_start returned false`);
  // ContextBase::onConfigure.
  vm.withActions(() => {
    if (vm.fn.proxy_on_configure) {
      vm.tempPlugin = true;
      ok = vm.call(root, 'proxy_on_configure', root.id, p.pluginConfig.length) !== 0;
      vm.tempPlugin = false;
    }
  });
  if (vm.failed) throw new Error(`vm ${vm.idx} failed in proxy_on_configure`);
  if (!ok) throw new Error(`vm ${vm.idx}: proxy_on_configure returned false (the plugin refused its configuration)`);
}

// ---------------------------------------------------------------------------
// The driver's operations.

const proxies = new Map();

function getProxy(m) {
  const p = proxies.get(m.proxy);
  if (!p) throw new Error(`no proxy ${m.proxy}`);
  return p;
}

// The next worker, round robin.
function pick(p) {
  const vm = p.vms[p.next % p.vms.length];
  p.next++;
  return vm;
}

function encodeResult(vm, s, r) {
  if (r.reset) return { vm: vm.idx, reset: true, details: r.details, failed: vm.failed };
  return {
    vm: vm.idx, status: r.status, headers: r.headers, body: Buffer.from(r.body).toString('base64'),
    local: r.local, details: r.details, failed: vm.failed, upstreamRequest: s.upstreamRequest || null,
  };
}

const ops = {
  load(m) {
    load(m.key, Buffer.from(m.wasm, 'base64'));
    return {};
  },
  start(m) {
    try {
      proxies.set(m.proxy, start(m.proxy, m.options));
    } catch (e) {
      // Envoy logs why a module could not be loaded or started at error.
      emit({ ev: 'log', proxy: m.proxy, vm: -1, level: LogError, msg: e.message });
      throw e;
    }
    return {};
  },
  stop(m) {
    const p = proxies.get(m.proxy);
    if (p) {
      p.stop();
      proxies.delete(m.proxy);
    }
    return {};
  },
  async request(m) {
    const vm = pick(getProxy(m));
    const s = new Stream(vm, m.req);
    const r = await s.run();
    return encodeResult(vm, s, r);
  },
  // The host functions a module of ABI 0.2.1 may import.
  provided() {
    return { names: [...hostFunctionTypes('0_2_1').keys()] };
  },
  metrics(m) {
    const out = {};
    for (const [name, rec] of getProxy(m).metrics) out[name] = rec.type === 2 ? rec.count : Number(rec.value);
    return { metrics: out };
  },
  // n requests one after another, timing the guest's share (every module
  // call of the request, host functions excluded) and the whole request.
  async bench(m) {
    const proxy = getProxy(m);
    proxy.measure = true;
    proxy.guestMs = 0;
    const cpu0 = process.cpuUsage();
    const t0 = performance.now();
    for (let i = 0; i < m.n; i++) {
      const vm = pick(proxy);
      await new Stream(vm, m.req).run();
      if (vm.failed) throw new Error('the VM failed during the benchmark');
    }
    const wall = performance.now() - t0;
    const cpu = process.cpuUsage(cpu0);
    proxy.measure = false;
    return { guestNs: (proxy.guestMs * 1e6) / m.n, wallNs: (wall * 1e6) / m.n, cpuNs: ((cpu.user + cpu.system) * 1e3) / m.n };
  },
};

const rl = createInterface({ input: process.stdin });
rl.on('line', async (line) => {
  let m;
  try {
    m = JSON.parse(line);
  } catch (e) {
    emit({ ev: 'error', msg: `bad request line: ${e.message}` });
    return;
  }
  try {
    const f = ops[m.op];
    if (!f) throw new Error(`unknown op ${m.op}`);
    const res = await f(m);
    emit({ id: m.id, res });
  } catch (e) {
    emit({ id: m.id, error: e && e.message ? e.message : String(e) });
  }
});
rl.on('close', () => process.exit(0));
