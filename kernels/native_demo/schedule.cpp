// kvdemo: the server-like scheduler (see schedule.h).
#include "schedule.h"

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>

namespace kvdemo {

std::vector<Request> named_schedule(const std::string & name, int prompt, int decode) {
    if (name == "two-slot-concurrent") {
        // both slots decode in the same ubatches: 4-D K/V views with ne[3] = 2
        return {{0, prompt, decode, -1}, {1, prompt, decode, -1}};
    }
    if (name == "slot1-first") {
        // a fresh boot's first request lands on slot 1, then slot 0, then slot 1 again (§4.4)
        return {{1, prompt, decode, -1}, {0, prompt, decode, 0},
                {1, prompt - prompt / 6, std::max(1, decode / 2), 1}};
    }
    return {};
}

namespace {

struct Live {
    int stream;
    int prompt_left;
    int decode_left;
    int position = 0;
    bool done() const { return prompt_left == 0 && decode_left == 0; }
};

}  // namespace

std::vector<Ubatch> make_ubatches(const std::vector<Request> & requests, int n_stream,
                                  int n_ubatch, int64_t kv_size) {
    std::vector<std::vector<int>> owner(n_stream, std::vector<int>((size_t) kv_size, -1));
    std::map<int, Live> live;
    std::set<int> finished;
    std::map<int, int> previous;  // slot -> request that last used it
    std::vector<Ubatch> out;
    while (finished.size() < requests.size()) {
        for (int i = 0; i < (int) requests.size(); ++i) {
            const Request & r = requests[i];
            const bool arrived = r.after < 0 || finished.count(r.after);
            if (live.count(i) || finished.count(i) || !arrived) {
                continue;
            }
            bool busy = false;
            for (const auto & [j, x] : live) {
                busy = busy || requests[j].slot == r.slot;
            }
            if (busy) {
                continue;
            }
            const int stream = n_stream > 1 ? r.slot : 0;
            auto prev = previous.find(r.slot);
            if (prev != previous.end()) {
                std::replace(owner[stream].begin(), owner[stream].end(), prev->second, -1);
            }
            previous[r.slot] = i;
            live.emplace(i, Live{stream, r.prompt, r.decode});
        }
        if (live.empty()) {
            throw std::runtime_error("schedule requests wait on each other forever");
        }
        std::map<int, int> want;
        for (const auto & [i, x] : live) {
            want[i] = x.prompt_left ? x.prompt_left : 1;
        }
        while (!want.empty()) {
            // split_equal: the same count from every stream in the ubatch
            int k = n_ubatch;
            for (const auto & [i, w] : want) {
                k = std::min(k, w);
            }
            k = std::min(k, std::max(1, n_ubatch / (int) want.size()));
            std::map<int, Lane> lanes;
            Ubatch ub;
            ub.index = (int) out.size();
            for (auto it = want.begin(); it != want.end();) {
                const int i = it->first;
                Live & x = live.at(i);
                Lane & lane = lanes[x.stream];
                lane.stream = x.stream;
                int got = 0;
                for (int64_t c = 0; c < kv_size && got < k; ++c) {
                    if (owner[x.stream][c] == -1) {
                        owner[x.stream][c] = i;
                        lane.requests.push_back(i);
                        lane.cells.push_back((int) c);
                        lane.positions.push_back(x.position + got);
                        ++got;
                    }
                }
                if (got < k) {
                    throw std::runtime_error("request " + std::to_string(i) + " needs more than the " +
                                             std::to_string(kv_size) + " cells of its stream (raise --ctx)");
                }
                x.position += k;
                if (x.prompt_left) {
                    x.prompt_left -= k;
                } else {
                    x.decode_left -= k;
                }
                ub.requests.push_back(i);
                it->second -= k;
                it = it->second == 0 ? want.erase(it) : std::next(it);
            }
            for (auto & [s, lane] : lanes) {
                ub.streams.push_back(s);
                ub.lanes.push_back(std::move(lane));
            }
            ub.tokens = (int) ub.lanes.front().cells.size();
            out.push_back(std::move(ub));
        }
        for (auto it = live.begin(); it != live.end();) {
            if (it->second.done()) {
                finished.insert(it->first);
                it = live.erase(it);
            } else {
                ++it;
            }
        }
    }
    return out;
}

}  // namespace kvdemo
