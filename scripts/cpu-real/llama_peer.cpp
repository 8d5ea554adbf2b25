// The llama.cpp peer of the CPU bench: score EXACTLY the token ids forkscore's modes bench fed
// its model (the bench's FORKSCORE_BENCH_DUMP file) with llama.cpp on the same checkpoint
// converted to GGUF, the way a llama.cpp user scores candidates with a prompt cache, and time it.
//
//   llama_peer MODEL.gguf DUMP.json OUT.json THREADS REPEATS [KV]
//
// KV: the K/V cache type, f16 (llama.cpp's default) or f32.
// Built against the llama.cpp tree by scripts/cpu-real/llama.sh (libllama + nlohmann/json from
// that tree). Per case (one shared prefix, R rows = one suffix per field, code ids per row):
//   prefill        the prefix decoded into sequence 0 (batches of n_batch tokens)
//   cached_serial  prefill, then per row: copy sequence 0 to sequence 1 (the prompt cache, no
//                  recompute), decode the row's suffix there, read the logits of its last token
//                  at the row's code ids, drop sequence 1
//   batched        prefill, copy sequence 0 to sequences 1..R, then ONE decode call holding
//                  every row's suffix in its own sequence, logits at each row's last token
// One warm-up, then REPEATS timed runs per mode (the KV memory cleared before each); medians.
// Agreement: each row's argmax code vs the dump's (forkscore's), and the largest |p - p_dump|
// over the softmax of the row's code logits (temperature 1).
#include "llama.h"
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

using json = nlohmann::json;

struct Row {
    std::vector<llama_token> suffix;
    std::vector<llama_token> codes;
    std::vector<float> dump_logits;
};

struct Case {
    int fields = 0;
    std::vector<llama_token> prefix;
    std::vector<Row> rows;
};

static double now_ms() {
    using namespace std::chrono;
    return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

static void die(const std::string & what) {
    fprintf(stderr, "llama_peer: %s\n", what.c_str());
    exit(1);
}

static void add(llama_batch & b, llama_token t, llama_pos pos, llama_seq_id seq, bool logits) {
    b.token[b.n_tokens] = t;
    b.pos[b.n_tokens] = pos;
    b.n_seq_id[b.n_tokens] = 1;
    b.seq_id[b.n_tokens][0] = seq;
    b.logits[b.n_tokens] = logits;
    b.n_tokens++;
}

static void prefill(llama_context * ctx, const Case & c, int n_batch) {
    llama_batch b = llama_batch_init(n_batch, 0, 1);
    for (size_t i = 0; i < c.prefix.size(); i += n_batch) {
        b.n_tokens = 0;
        for (size_t j = i; j < std::min(c.prefix.size(), i + n_batch); j++) {
            add(b, c.prefix[j], (llama_pos) j, 0, false);
        }
        if (llama_decode(ctx, b) != 0) die("prefill decode failed");
    }
    llama_batch_free(b);
}

static std::vector<float> codes_at(llama_context * ctx, int index, const Row & r) {
    const float * logits = llama_get_logits_ith(ctx, index);
    if (!logits) die("no logits at an output row");
    std::vector<float> out;
    for (llama_token t : r.codes) out.push_back(logits[t]);
    return out;
}

static std::vector<std::vector<float>> cached_serial(llama_context * ctx, const Case & c, int n_batch) {
    llama_memory_t mem = llama_get_memory(ctx);
    prefill(ctx, c, n_batch);
    std::vector<std::vector<float>> out;
    llama_batch b = llama_batch_init(n_batch, 0, 1);
    const llama_pos p = (llama_pos) c.prefix.size();
    for (const Row & r : c.rows) {
        llama_memory_seq_cp(mem, 0, 1, -1, -1);
        b.n_tokens = 0;
        for (size_t j = 0; j < r.suffix.size(); j++) {
            add(b, r.suffix[j], p + (llama_pos) j, 1, j + 1 == r.suffix.size());
        }
        if (llama_decode(ctx, b) != 0) die("cached_serial decode failed");
        out.push_back(codes_at(ctx, b.n_tokens - 1, r));
        llama_memory_seq_rm(mem, 1, -1, -1);
    }
    llama_batch_free(b);
    return out;
}

static std::vector<std::vector<float>> batched(llama_context * ctx, const Case & c, int n_batch) {
    llama_memory_t mem = llama_get_memory(ctx);
    prefill(ctx, c, n_batch);
    size_t total = 0;
    for (const Row & r : c.rows) total += r.suffix.size();
    llama_batch b = llama_batch_init((int) std::max<size_t>(total, 1), 0, 1);
    const llama_pos p = (llama_pos) c.prefix.size();
    std::vector<int> last;
    for (size_t i = 0; i < c.rows.size(); i++) {
        llama_memory_seq_cp(mem, 0, (llama_seq_id) (i + 1), -1, -1);
        const Row & r = c.rows[i];
        for (size_t j = 0; j < r.suffix.size(); j++) {
            add(b, r.suffix[j], p + (llama_pos) j, (llama_seq_id) (i + 1), j + 1 == r.suffix.size());
        }
        last.push_back(b.n_tokens - 1);
    }
    if (llama_decode(ctx, b) != 0) die("batched decode failed");
    std::vector<std::vector<float>> out;
    for (size_t i = 0; i < c.rows.size(); i++) out.push_back(codes_at(ctx, last[i], c.rows[i]));
    llama_batch_free(b);
    return out;
}

static std::vector<float> softmax(const std::vector<float> & x) {
    float top = *std::max_element(x.begin(), x.end());
    std::vector<float> e;
    double s = 0;
    for (float v : x) { e.push_back(std::exp(v - top)); s += e.back(); }
    for (float & v : e) v = (float) (v / s);
    return e;
}

static json agreement(const Case & c, const std::vector<std::vector<float>> & logits) {
    int agree = 0;
    double dp = 0, dl = 0;
    for (size_t i = 0; i < c.rows.size(); i++) {
        const auto & a = logits[i];
        const auto & d = c.rows[i].dump_logits;
        agree += std::max_element(a.begin(), a.end()) - a.begin() == std::max_element(d.begin(), d.end()) - d.begin();
        auto pa = softmax(a), pd = softmax(d);
        for (size_t k = 0; k < a.size(); k++) {
            dp = std::max(dp, (double) std::fabs(pa[k] - pd[k]));
            dl = std::max(dl, (double) std::fabs(a[k] - d[k]));
        }
    }
    return {{"argmax_agree", agree}, {"rows", c.rows.size()}, {"max_abs_dp", dp}, {"max_abs_dlogit", dl}};
}

int main(int argc, char ** argv) {
    if (argc != 6 && argc != 7) die("usage: llama_peer MODEL.gguf DUMP.json OUT.json THREADS REPEATS [f16|f32]");
    const std::string kv = argc == 7 ? argv[6] : "f16";
    if (kv != "f16" && kv != "f32") die("KV cache type must be f16 or f32, not " + kv);
    const std::string model_path = argv[1], dump_path = argv[2], out_path = argv[3];
    const int threads = std::stoi(argv[4]), repeats = std::stoi(argv[5]);
    std::ifstream f(dump_path);
    if (!f) die("cannot read " + dump_path);
    json dump = json::parse(f);
    std::vector<Case> cases;
    size_t max_rows = 1, max_len = 1;
    for (const auto & jc : dump.at("cases")) {
        Case c;
        c.fields = jc.at("fields").get<int>();
        c.prefix = jc.at("prefix_ids").get<std::vector<llama_token>>();
        size_t longest = 0;
        for (const auto & jr : jc.at("rows")) {
            Row r{jr.at("suffix_ids").get<std::vector<llama_token>>(), jr.at("code_ids").get<std::vector<llama_token>>(),
                  jr.at("logits").get<std::vector<float>>()};
            if (r.suffix.empty()) die("a row with an empty suffix");
            longest = std::max(longest, r.suffix.size());
            c.rows.push_back(std::move(r));
        }
        max_rows = std::max(max_rows, c.rows.size());
        max_len = std::max(max_len, c.prefix.size() + longest);
        cases.push_back(std::move(c));
    }

    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(model_path.c_str(), mp);
    if (!model) die("cannot load " + model_path);
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t) (max_len + max_rows * 64 + 256);
    cp.n_batch = 512;
    cp.n_ubatch = 512;
    cp.n_seq_max = (uint32_t) (max_rows + 1);
    cp.kv_unified = true;  // sequences copied from sequence 0 share its cells (the prompt cache)
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    cp.no_perf = true;
    cp.type_k = kv == "f32" ? GGML_TYPE_F32 : GGML_TYPE_F16;
    cp.type_v = cp.type_k;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) die("cannot create a context");
    const int n_batch = (int) llama_n_batch(ctx);
    llama_memory_t mem = llama_get_memory(ctx);

    json out = {{"peer", "llama.cpp"}, {"model", model_path}, {"threads", threads}, {"repeats", repeats}, {"kv_cache", kv},
                {"system_info", llama_print_system_info()}, {"cases", json::array()}};
    for (const Case & c : cases) {
        json modes = json::object();
        for (const std::string mode : {"prefill", "cached_serial", "batched"}) {
            std::vector<double> ms;
            std::vector<std::vector<float>> logits;
            for (int i = 0; i <= repeats; i++) {  // i == 0: warm-up
                llama_memory_clear(mem, true);
                double t0 = now_ms();
                if (mode == "prefill") prefill(ctx, c, n_batch);
                else if (mode == "cached_serial") logits = cached_serial(ctx, c, n_batch);
                else logits = batched(ctx, c, n_batch);
                double t = now_ms() - t0;
                if (i > 0) ms.push_back(t);
            }
            std::sort(ms.begin(), ms.end());
            json m = {{"ms", ms[ms.size() / 2]}, {"runs_ms", ms}};
            if (!logits.empty()) m["agreement"] = agreement(c, logits);
            modes[mode] = m;
            fprintf(stderr, "[llama.cpp] fields %2d prefix %5zu %-14s %10.1f ms\n", c.fields, c.prefix.size(),
                    mode.c_str(), ms[ms.size() / 2]);
        }
        out["cases"].push_back({{"fields", c.fields}, {"prefix_tokens", c.prefix.size()}, {"modes", modes}});
        std::ofstream(out_path) << out.dump(1) << "\n";
    }
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
