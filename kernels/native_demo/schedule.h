// kvdemo: requests -> ubatches, the way llama-server's continuous batching feeds a
// non-unified KV cache with one stream per slot.
//
// Each server iteration every live request contributes its remaining prompt or one decode
// token; with several KV streams a ubatch takes the same number of tokens from every stream
// in it (split_equal), so a ubatch holding both slots has ns = 2 (§4.1). A request takes the
// lowest free cells of its slot's stream; a slot's cells are freed when its next request
// starts (memory_seq_rm). Positions equal cells for a fresh request.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvdemo {

struct Request {
    int slot;
    int prompt;
    int decode;
    int after;  // index of the request that must finish first, -1 = at start
};

struct Lane {
    int stream;
    std::vector<int> requests;   // per token
    std::vector<int> cells;      // stream-local cell per token
    std::vector<int> positions;  // position in its sequence per token
};

struct Ubatch {
    int index;
    std::vector<int> streams;    // sorted
    std::vector<int> requests;
    int tokens;                  // per stream
    std::vector<Lane> lanes;
    bool prefill() const { return tokens > 1; }
};

// the named schedules: "two-slot-concurrent", "slot1-first"; empty when unknown
std::vector<Request> named_schedule(const std::string & name, int prompt, int decode);

// all ubatches of a schedule; throws std::runtime_error when a stream runs out of cells
std::vector<Ubatch> make_ubatches(const std::vector<Request> & requests, int n_stream,
                                  int n_ubatch, int64_t kv_size);

}  // namespace kvdemo
