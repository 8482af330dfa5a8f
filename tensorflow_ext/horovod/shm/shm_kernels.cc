// tensorflow_ext: the intra-node stages of the 2D allreduce (tensorflow_ext/horovod/shm_allreduce.py) through a
// POSIX shared-memory segment that the L ranks of one node (one host) map, instead of Gloo TCP on the same cores:
//
//   TfExtHvdShmReduceScatter(buffer: T [n]) -> slice: T [n / L]
//       every local rank's buffer summed, this rank's 1/L slice (slice j = entries [j*n/L, (j+1)*n/L)).
//   TfExtHvdShmAllgather(slice: T [m]) -> buffer: T [m * L]
//       every local rank's slice, concatenated in local rank order.
//
// Contract
//  * The segment (attr `segment`, a shm_open name unique to the job, the node and the fused buffer) holds a header,
//    L input slots of n entries and one result buffer of n entries. Local rank 0 creates it on first use (an
//    existing segment of that name is left over from a job that crashed while its ranks attached: it is unlinked
//    and replaced); the others attach, waiting up to the timeout for it. The last rank to attach unlinks the name,
//    so a finished or crashed job leaves nothing under /dev/shm; the mapping lives until the process exits. A rank
//    whose barrier times out unlinks the name too (a rank that never attached would leave it otherwise).
//  * Every stage is: write this rank's part, announce step g (a per-rank counter in the segment), wait until every
//    local rank announced g (futex on a shared "bell" word, woken by each announcement), then read. A rank counts
//    its steps per segment (the reduce-scatter and the allgather of each step are two), so successive steps never
//    mix: a rank writes its slot for step g + 1 only after every rank announced step g, that is, after every rank
//    finished reading step g - 1's slots. Each fused buffer has its own segment, so buffers in flight at once (TF
//    runs the reductions of one step concurrently) never share memory. In one process the ops of a segment run one
//    at a time (a mutex); two session.run calls that reduce the same buffer at once are not supported (their steps
//    could pair up differently on different ranks), as with Horovod's named collectives.
//  * A wait longer than `timeout_seconds` fails the op with DeadlineExceeded naming the local ranks (and their
//    global ranks) that did not arrive: the other ranks never hang on a rank that died or stopped.
//  * Sums: float32 is s_0 + s_1 + ... + s_{L-1} in local rank order (for L = 2 the bits of Gloo's reduce-scatter,
//    a single IEEE addition, which is commutative); float16 and bfloat16 are summed in float32 from +0 in local rank
//    order and rounded once (compression.h SumParts: the bits of compression_ops.sum_parts; for L = 2 also the bits
//    of Gloo's float16 addition: float32 holds at least 2 x 11 + 2 bits, so rounding the float32 sum of two halves
//    to half is the correctly rounded half sum; only -0 + -0 gives +0 here).
//  * The kernels are asynchronous: the wait runs on its own thread, so an inter-op thread pool of one thread still
//    runs the other buffers' ops (a rank blocked on buffer A while its peer waits on buffer B would deadlock).

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow/core/platform/logging.h"
#include "tensorflow/core/platform/strcat.h"
#include "tensorflow_ext/horovod/kernels/compression.h"

namespace tfext {
namespace {

using tensorflow::AsyncOpKernel;
using tensorflow::DataType;
using tensorflow::DEVICE_CPU;
using tensorflow::OkStatus;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::shape_inference::DimensionHandle;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;
namespace errors = tensorflow::errors;

constexpr uint64_t kMagic = 0x74666578324453ULL;  // "tfex2DS"
constexpr int kMaxLocalSize = 256;
constexpr size_t kLine = 64;

static_assert(std::atomic<uint32_t>::is_always_lock_free, "process-shared atomics must be lock free");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "process-shared atomics must be lock free");

struct alignas(kLine) RankLine {
  std::atomic<uint64_t> step;  // the last step this local rank announced
};

struct alignas(kLine) Header {
  std::atomic<uint64_t> magic;  // kMagic once the creator initialised the header
  int32_t creator_pid;
  int32_t local_size;
  int64_t slot_bytes;
  std::atomic<uint32_t> attached;             // ranks mapped so far (the last one unlinks the name)
  alignas(kLine) std::atomic<uint32_t> bell;  // incremented and futex-woken by each announcement
};

size_t DataOffset(int local_size) {
  const size_t end = sizeof(Header) + sizeof(RankLine) * local_size;
  return (end + 4095) / 4096 * 4096;
}

size_t SegmentBytes(int local_size, int64_t slot_bytes) {
  return DataOffset(local_size) + static_cast<size_t>(slot_bytes) * (local_size + 1);
}

long Futex(std::atomic<uint32_t>* addr, int op, uint32_t val, const timespec* timeout) {
  // Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, val, timeout, nullptr, 0);
}

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

bool ProcessAlive(int32_t pid) { return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM); }

// One node's segment for one fused buffer, as this process maps it.
class Segment {
 public:
  Segment(std::string name, int local_rank, int local_size, int64_t first_rank, int64_t slot_bytes)
      : name_(std::move(name)),
        local_rank_(local_rank),
        local_size_(local_size),
        first_rank_(first_rank),
        slot_bytes_(slot_bytes) {}

  ~Segment() {
    if (base_ != nullptr) munmap(base_, bytes_);
  }

  // Creates (local rank 0) or attaches to the segment, waiting at most `timeout` seconds for local rank 0.
  Status Open(double timeout) {
    bytes_ = SegmentBytes(local_size_, slot_bytes_);
    return local_rank_ == 0 ? Create() : Attach(timeout);
  }

  bool open() const { return base_ != nullptr; }
  std::mutex* mu() { return &mu_; }
  uint64_t NextStep() { return ++step_; }
  char* slot(int r) { return base_ + DataOffset(local_size_) + static_cast<size_t>(slot_bytes_) * r; }
  char* result() { return slot(local_size_); }

  // Announces `step` and waits until every local rank announced it (or fails after `timeout` seconds).
  Status Barrier(uint64_t step, double timeout, const char* stage) {
    Header* h = header();
    line(local_rank_)->step.store(step, std::memory_order_release);
    h->bell.fetch_add(1, std::memory_order_acq_rel);
    Futex(&h->bell, FUTEX_WAKE, INT32_MAX, nullptr);
    const double deadline = Now() + timeout;
    while (true) {
      const uint32_t bell = h->bell.load(std::memory_order_acquire);
      bool all = true;
      for (int r = 0; r < local_size_ && all; ++r) all = line(r)->step.load(std::memory_order_acquire) >= step;
      if (all) return OkStatus();
      const double left = deadline - Now();
      if (left <= 0) return Missing(step, timeout, stage);
      timespec ts;
      ts.tv_sec = static_cast<time_t>(left);
      ts.tv_nsec = static_cast<long>((left - static_cast<double>(ts.tv_sec)) * 1e9);
      Futex(&h->bell, FUTEX_WAIT, bell, &ts);  // returns at once when the bell rang since it was read
    }
  }

 private:
  Header* header() { return reinterpret_cast<Header*>(base_); }
  RankLine* line(int r) { return reinterpret_cast<RankLine*>(base_ + sizeof(Header)) + r; }

  Status Missing(uint64_t step, double timeout, const char* stage) {
    // A rank that never attached leaves the name linked (the last to attach unlinks it); remove it so that the
    // failed job leaves nothing under /dev/shm (a late rank then fails to attach, as it would fail its barrier).
    shm_unlink(name_.c_str());
    std::string who;
    for (int r = 0; r < local_size_; ++r) {
      const uint64_t got = line(r)->step.load(std::memory_order_acquire);
      if (got >= step) continue;
      who += tensorflow::strings::StrCat(who.empty() ? "" : ", ", "local rank ", r, " (rank ", first_rank_ + r,
                                         ", last at barrier ", got, ")");
    }
    return errors::DeadlineExceeded("2D allreduce over shared memory: ", who, " did not reach barrier ", step,
                                    " (the intra-node ", stage, ") of segment ", name_, " within ", timeout,
                                    " s (TF_EXT_HVD_SHM_TIMEOUT_S); that rank exited, crashed or is stuck. This is "
                                    "local rank ",
                                    local_rank_, " (rank ", first_rank_ + local_rank_, ")");
  }

  Status Map(int fd) {
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      return errors::Internal("mmap of shared-memory segment ", name_, " (", bytes_,
                              " bytes) failed: ", strerror(errno));
    }
    base_ = static_cast<char*>(p);
    return OkStatus();
  }

  Status Create() {
    int fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 && errno == EEXIST) {
      // Only local rank 0 of this job creates this name, once per process: what exists is a crashed job's.
      LOG(WARNING) << "tensorflow_ext: replacing stale shared-memory segment " << name_
                   << " (left by a job that crashed while its ranks attached)";
      shm_unlink(name_.c_str());
      fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    }
    if (fd < 0) {
      return errors::Internal("shm_open(", name_, ", O_CREAT) failed: ", strerror(errno),
                              " (is /dev/shm mounted and writable?)");
    }
    // posix_fallocate reserves the pages now: on a full tmpfs a plain ftruncate would succeed and the first write
    // past the free space would kill the process with SIGBUS.
    int err = ftruncate(fd, static_cast<off_t>(bytes_)) != 0 ? errno : 0;
    if (err == 0) err = posix_fallocate(fd, 0, static_cast<off_t>(bytes_));
    if (err != 0) {
      close(fd);
      shm_unlink(name_.c_str());
      return errors::ResourceExhausted("sizing shared-memory segment ", name_, " to ", bytes_,
                                       " bytes failed: ", strerror(err), " (is /dev/shm large enough?)");
    }
    Status s = Map(fd);
    close(fd);
    if (!s.ok()) {
      shm_unlink(name_.c_str());
      return s;
    }
    Header* h = header();
    h->creator_pid = getpid();
    h->local_size = local_size_;
    h->slot_bytes = slot_bytes_;
    h->attached.store(1, std::memory_order_relaxed);
    h->bell.store(0, std::memory_order_relaxed);
    for (int r = 0; r < local_size_; ++r) line(r)->step.store(0, std::memory_order_relaxed);
    h->magic.store(kMagic, std::memory_order_release);
    if (local_size_ == 1) shm_unlink(name_.c_str());
    return OkStatus();
  }

  Status Attach(double timeout) {
    const double deadline = Now() + timeout;
    std::string last = "it does not exist";
    while (Now() < deadline) {
      int fd = shm_open(name_.c_str(), O_RDWR, 0600);
      if (fd >= 0) {
        struct stat st;
        const bool sized = fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) == bytes_;
        if (sized) {
          TF_RETURN_IF_ERROR(Map(fd));
          close(fd);
          Header* h = header();
          if (h->magic.load(std::memory_order_acquire) == kMagic) {
            if (ProcessAlive(h->creator_pid) && h->local_size == local_size_ && h->slot_bytes == slot_bytes_) {
              if (static_cast<int>(h->attached.fetch_add(1, std::memory_order_acq_rel)) + 1 == local_size_) {
                shm_unlink(name_.c_str());  // everyone mapped it: nothing is left behind, whatever happens next
              }
              return OkStatus();
            }
            last = "a stale one (its creator exited) is there";
          } else {
            last = "it is not initialised yet";
          }
          munmap(base_, bytes_);
          base_ = nullptr;
        } else {
          close(fd);
          last = "it is not sized yet";
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return errors::DeadlineExceeded("2D allreduce over shared memory: local rank 0 (rank ", first_rank_,
                                    ") did not create segment ", name_, " within ", timeout, " s (", last,
                                    "); that rank exited, crashed or is stuck. This is local rank ", local_rank_,
                                    " (rank ", first_rank_ + local_rank_, ")");
  }

  const std::string name_;
  const int local_rank_;
  const int local_size_;
  const int64_t first_rank_;
  const int64_t slot_bytes_;
  size_t bytes_ = 0;
  char* base_ = nullptr;
  uint64_t step_ = 0;
  std::mutex mu_;
};

// Segments by name, for the life of the process (the reduce-scatter and the allgather of a buffer share one).
std::shared_ptr<Segment> GetSegment(const std::string& name, int local_rank, int local_size, int64_t first_rank,
                                    int64_t slot_bytes) {
  static std::mutex* mu = new std::mutex;
  static auto* segments = new std::map<std::string, std::shared_ptr<Segment>>;
  std::lock_guard<std::mutex> lock(*mu);
  auto& s = (*segments)[name];
  if (s == nullptr) s = std::make_shared<Segment>(name, local_rank, local_size, first_rank, slot_bytes);
  return s;
}

class ShmStageOp : public AsyncOpKernel {
 public:
  ShmStageOp(OpKernelConstruction* ctx, bool gather) : AsyncOpKernel(ctx), gather_(gather) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("segment", &segment_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("local_rank", &local_rank_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("local_size", &local_size_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("first_rank", &first_rank_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("timeout_seconds", &timeout_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("T", &dtype_));
    OP_REQUIRES(ctx, local_size_ >= 1 && local_size_ <= kMaxLocalSize,
                errors::InvalidArgument("local_size must be in [1, ", kMaxLocalSize, "], got ", local_size_));
    OP_REQUIRES(ctx, local_rank_ >= 0 && local_rank_ < local_size_,
                errors::InvalidArgument("local_rank must be in [0, local_size=", local_size_, "), got ", local_rank_));
    OP_REQUIRES(ctx, !segment_.empty() && segment_[0] == '/' && segment_.find('/', 1) == std::string::npos,
                errors::InvalidArgument("segment must be a shm_open name \"/name\", got \"", segment_, "\""));
    OP_REQUIRES(ctx, timeout_ > 0, errors::InvalidArgument("timeout_seconds must be > 0, got ", timeout_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const Tensor& in = ctx->input(0);
    OP_REQUIRES_ASYNC(ctx, in.dims() == 1, errors::InvalidArgument("input must be 1-D, got ", in.shape()), done);
    const int64_t esize = tensorflow::DataTypeSize(dtype_);
    const int64_t n = gather_ ? in.NumElements() * local_size_ : in.NumElements();
    OP_REQUIRES_ASYNC(ctx, n % local_size_ == 0,
                      errors::InvalidArgument("the reduce-scatter's buffer has ", n, " entries, not a multiple of ",
                                              "the node's ", local_size_, " ranks"),
                      done);
    Tensor* out = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, TensorShape({gather_ ? n : n / local_size_}), &out), done);
    std::shared_ptr<Segment> seg = GetSegment(segment_, local_rank_, local_size_, first_rank_, n * esize);
    // The wait blocks: on its own thread, off TensorFlow's inter-op pool.
    std::thread([this, ctx, done, seg, in, out, n, esize]() {
      Status s = Run(seg.get(), in, out, n, esize);
      if (!s.ok()) ctx->SetStatus(s);
      done();
    }).detach();
  }

 private:
  Status Run(Segment* seg, const Tensor& in, Tensor* out, int64_t n, int64_t esize) {
    std::lock_guard<std::mutex> lock(*seg->mu());
    if (!seg->open()) TF_RETURN_IF_ERROR(seg->Open(timeout_));
    const int64_t m = n / local_size_;
    const char* src = static_cast<const char*>(in.tensor_data().data());
    char* dst = const_cast<char*>(out->tensor_data().data());
    if (!gather_) {
      std::memcpy(seg->slot(local_rank_), src, n * esize);
      TF_RETURN_IF_ERROR(seg->Barrier(seg->NextStep(), timeout_, "reduce-scatter"));
      SumSlice(seg, local_rank_ * m, m, dst);
    } else {
      std::memcpy(seg->result() + local_rank_ * m * esize, src, m * esize);
      TF_RETURN_IF_ERROR(seg->Barrier(seg->NextStep(), timeout_, "allgather"));
      std::memcpy(dst, seg->result(), n * esize);
    }
    return OkStatus();
  }

  // dst[0, m) = sum over local ranks of their slot's entries [begin, begin + m) (the contract's order).
  void SumSlice(Segment* seg, int64_t begin, int64_t m, char* dst) {
    if (dtype_ == tensorflow::DT_FLOAT) {
      float* o = reinterpret_cast<float*>(dst);
      const float* s0 = reinterpret_cast<const float*>(seg->slot(0)) + begin;
      if (local_size_ == 1) {
        std::memcpy(o, s0, m * sizeof(float));
        return;
      }
      const float* s1 = reinterpret_cast<const float*>(seg->slot(1)) + begin;
      for (int64_t i = 0; i < m; ++i) o[i] = s0[i] + s1[i];
      for (int r = 2; r < local_size_; ++r) {
        const float* sr = reinterpret_cast<const float*>(seg->slot(r)) + begin;
        for (int64_t i = 0; i < m; ++i) o[i] += sr[i];
      }
      return;
    }
    const int64_t stride = (seg->slot(1) - seg->slot(0)) / 2;  // in uint16 entries
    hvd::SumParts(reinterpret_cast<const uint16_t*>(seg->slot(0)) + begin, local_size_, stride, m,
                  dtype_ == tensorflow::DT_HALF ? hvd::WireFormat::kFloat16 : hvd::WireFormat::kBFloat16,
                  reinterpret_cast<uint16_t*>(dst));
  }

  const bool gather_;
  std::string segment_;
  int local_rank_ = 0;
  int local_size_ = 1;
  int64_t first_rank_ = 0;
  float timeout_ = 0;
  DataType dtype_;
};

class ShmReduceScatterOp : public ShmStageOp {
 public:
  explicit ShmReduceScatterOp(OpKernelConstruction* ctx) : ShmStageOp(ctx, false) {}
};

class ShmAllgatherOp : public ShmStageOp {
 public:
  explicit ShmAllgatherOp(OpKernelConstruction* ctx) : ShmStageOp(ctx, true) {}
};

REGISTER_OP("TfExtHvdShmReduceScatter")
    .Input("buffer: T")
    .Output("slice: T")
    .Attr("T: {float, half, bfloat16}")
    .Attr("segment: string")
    .Attr("local_rank: int >= 0")
    .Attr("local_size: int >= 1")
    .Attr("first_rank: int >= 0")
    .Attr("timeout_seconds: float = 600.0")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle in;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &in));
      int64_t local_size;
      TF_RETURN_IF_ERROR(c->GetAttr("local_size", &local_size));
      DimensionHandle m;
      TF_RETURN_IF_ERROR(c->Divide(c->Dim(in, 0), local_size, /*evenly_divisible=*/true, &m));
      c->set_output(0, c->Vector(m));
      return OkStatus();
    })
    .Doc("The node's buffers summed through shared memory; this local rank's 1/local_size slice.");

REGISTER_OP("TfExtHvdShmAllgather")
    .Input("slice: T")
    .Output("buffer: T")
    .Attr("T: {float, half, bfloat16}")
    .Attr("segment: string")
    .Attr("local_rank: int >= 0")
    .Attr("local_size: int >= 1")
    .Attr("first_rank: int >= 0")
    .Attr("timeout_seconds: float = 600.0")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle in;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &in));
      int64_t local_size;
      TF_RETURN_IF_ERROR(c->GetAttr("local_size", &local_size));
      DimensionHandle n;
      TF_RETURN_IF_ERROR(c->Multiply(c->Dim(in, 0), local_size, &n));
      c->set_output(0, c->Vector(n));
      return OkStatus();
    })
    .Doc("The node's slices through shared memory, concatenated in local rank order.");

REGISTER_KERNEL_BUILDER(Name("TfExtHvdShmReduceScatter").Device(DEVICE_CPU), ShmReduceScatterOp);
REGISTER_KERNEL_BUILDER(Name("TfExtHvdShmAllgather").Device(DEVICE_CPU), ShmAllgatherOp);

}  // namespace
}  // namespace tfext
