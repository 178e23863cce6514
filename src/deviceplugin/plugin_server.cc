#include "deviceplugin/plugin_server.h"

#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>

#include "common/json.h"
#include "common/log.h"
#include "common/quantity.h"
#include "control/client.h"
#include "deviceplugin/allocate.h"
#include "k8s/deviceplugin/v1beta1/api.grpc.pb.h"
#include "k8s/podresources/v1/api.grpc.pb.h"

namespace nvshare::deviceplugin {
namespace {

using Clock = std::chrono::steady_clock;

std::string base_name(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

// ---- shared state and the gRPC service ---------------------------------------------------------

struct PluginServer::Impl final : public v1beta1::DevicePlugin::Service {
  Impl(PluginConfig c, std::unique_ptr<GpuInventory> inv, PluginServerTiming t)
      : config(std::move(c)), inventory(std::move(inv)), timing(t) {}

  const PluginConfig config;
  const std::unique_ptr<GpuInventory> inventory;
  const PluginServerTiming timing;
  MemoryLimitsSource memory_limits;
  PodLimitsLookup pod_limits;
  std::unique_ptr<v1::PodResourcesLister::Stub> pod_resources;
  // Each container's settings (settings-dir set): Allocate adds, the supervisor completes.
  std::mutex settings_mu;
  std::unique_ptr<ContainerSettings> settings;  // guarded by settings_mu

  mutable std::mutex mu;
  std::condition_variable changed;
  std::vector<ManagedGpu> gpus;  // guarded by mu
  std::uint64_t version = 0;     // guarded by mu; bumped on every health change
  std::uint64_t generation = 0;  // guarded by mu; bumped when a server instance ends
  bool stopping = false;         // guarded by mu
  PluginServerStats stats;       // guarded by mu

  std::unique_ptr<grpc::Server> server;  // supervisor thread (and start/stop) only
  std::optional<FileIdentity> served_socket;
  std::thread supervisor;
  int wake_fd = -1;
  int inotify_fd = -1;
  int kubelet_watch = -1;
  bool started = false;

  // -- DevicePlugin --

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                      v1beta1::DevicePluginOptions* options) override {
    options->set_pre_start_required(false);
    options->set_get_preferred_allocation_available(true);
    return grpc::Status::OK;
  }

  v1beta1::ListAndWatchResponse device_list_locked() const {
    v1beta1::ListAndWatchResponse response;
    for (const ManagedGpu& gpu : gpus) {
      for (int slot = 0; slot < gpu.slots; ++slot) {
        v1beta1::Device* device = response.add_devices();
        device->set_id(make_device_id(gpu.uuid, slot));
        device->set_health(gpu.healthy ? kHealthy : kUnhealthy);
      }
    }
    return response;
  }

  grpc::Status ListAndWatch(grpc::ServerContext* context, const v1beta1::Empty*,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) override {
    std::unique_lock lock(mu);
    const std::uint64_t my_generation = generation;
    NVSHARE_INFO("ListAndWatch: the kubelet is watching the device list");
    while (true) {
      const std::uint64_t sent_version = version;
      const v1beta1::ListAndWatchResponse response = device_list_locked();
      lock.unlock();
      if (!writer->Write(response)) {
        NVSHARE_INFO("ListAndWatch: the stream closed");
        return grpc::Status::OK;
      }
      lock.lock();
      // Cancellation of the call is not signalled to the condition variable; a bounded wait
      // notices it.
      while (version == sent_version && !stopping && generation == my_generation &&
             !context->IsCancelled()) {
        changed.wait_for(lock, std::chrono::milliseconds(500));
      }
      if (stopping || generation != my_generation || context->IsCancelled()) {
        return grpc::Status::OK;
      }
    }
  }

  Result<std::vector<LivePod>> list_pods() {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + timing.rpc_timeout);
    v1::ListPodResourcesRequest request;
    v1::ListPodResourcesResponse response;
    const grpc::Status status = pod_resources->List(&context, request, &response);
    if (!status.ok()) {
      return make_error("pod-resources List at " + config.pod_resources_socket + ": " +
                        status.error_message());
    }
    std::vector<LivePod> pods;
    for (const v1::PodResources& pod : response.pod_resources()) {
      LivePod live{pod.namespace_() + "/" + pod.name(), {}, {}};
      for (const v1::ContainerResources& container : pod.containers()) {
        std::vector<std::string> held;
        for (const v1::ContainerDevices& devices : container.devices()) {
          if (devices.resource_name() != config.resource_name) continue;
          held.insert(held.end(), devices.device_ids().begin(), devices.device_ids().end());
        }
        live.device_ids.insert(live.device_ids.end(), held.begin(), held.end());
        if (!held.empty()) live.containers.push_back(std::move(held));
      }
      if (!live.device_ids.empty()) pods.push_back(std::move(live));
    }
    return pods;
  }

  grpc::Status GetPreferredAllocation(grpc::ServerContext*,
                                      const v1beta1::PreferredAllocationRequest* request,
                                      v1beta1::PreferredAllocationResponse* response) override {
    std::vector<LivePod> pods;
    if (auto listed = list_pods(); listed) {
      pods = std::move(listed).value();
    } else {
      NVSHARE_WARN("placement without the live pod list (%s); counting allocated slots only",
                   listed.error().message.c_str());
    }
    std::map<std::string, std::uint64_t> limits;
    if (memory_limits) limits = memory_limits();
    const std::vector<ManagedGpu> snapshot = gpus_snapshot();

    for (const v1beta1::ContainerPreferredAllocationRequest& container :
         request->container_requests()) {
      PlacementRequest placement;
      placement.available.assign(container.available_deviceids().begin(),
                                 container.available_deviceids().end());
      placement.must_include.assign(container.must_include_deviceids().begin(),
                                    container.must_include_deviceids().end());
      placement.size = container.allocation_size();
      const auto load = compute_load(snapshot, pods, limits, placement.available);
      auto chosen = preferred_devices(snapshot, load, placement);
      if (!chosen) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "GetPreferredAllocation: " + chosen.error().message);
      }
      std::string shown;
      for (const std::string& id : chosen.value()) shown += (shown.empty() ? "" : " ") + id;
      NVSHARE_INFO("preferred allocation of %d: %s", placement.size, shown.c_str());
      auto* out = response->add_container_responses();
      for (const std::string& id : chosen.value()) out->add_deviceids(id);
    }
    return grpc::Status::OK;
  }

  grpc::Status Allocate(grpc::ServerContext* context, const v1beta1::AllocateRequest* request,
                        v1beta1::AllocateResponse* response) override {
    grpc::Status status = allocate(context, request, response);
    std::lock_guard lock(mu);
    if (!status.ok()) {
      ++stats.allocate_refusals;
      return status;
    }
    for (const v1beta1::ContainerAllocateRequest& container : request->container_requests()) {
      for (const std::string& id : container.devices_ids()) {
        ++stats.allocated_slots[id.substr(0, id.rfind("__"))];
      }
    }
    return status;
  }

  grpc::Status allocate(grpc::ServerContext*, const v1beta1::AllocateRequest* request,
                        v1beta1::AllocateResponse* response) {
    const std::vector<ManagedGpu> snapshot = gpus_snapshot();
    for (const v1beta1::ContainerAllocateRequest& container : request->container_requests()) {
      const std::vector<std::string> ids(container.devices_ids().begin(),
                                         container.devices_ids().end());
      if (Status checked = check_device_ids(config, snapshot, ids); !checked) {
        NVSHARE_WARN("Allocate refused: %s", checked.error().message.c_str());
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "Allocate: " + checked.error().message);
      }
      std::string settings_dir;
      {
        std::lock_guard lock(settings_mu);
        if (settings) {
          auto created = settings->create(ids, SteadyClock::instance().now());
          if (!created) {
            // Without its settings the container's environment could turn enforcement off.
            NVSHARE_ERROR("Allocate refused: %s", created.error().message.c_str());
            return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                "Allocate: " + created.error().message);
          }
          settings_dir = created.value();
        }
      }
      if (Status written = write_container_cdi_spec(settings_dir); !written) {
        NVSHARE_ERROR("Allocate refused: %s", written.error().message.c_str());
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "Allocate: " + written.error().message);
      }
      auto allocation = container_allocation(config, snapshot, ids, settings_dir);
      if (!allocation) {
        NVSHARE_WARN("Allocate refused: %s", allocation.error().message.c_str());
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "Allocate: " + allocation.error().message);
      }
      NVSHARE_INFO("allocated %s to a container: %s", config.resource_name.c_str(),
                   allocated_gpus(allocation.value()).c_str());
      *response->add_container_responses() = std::move(allocation).value();
    }
    return grpc::Status::OK;
  }

  // With CDI edits, the container's settings reach it through its own CDI device, whose spec
  // must be on disk before the runtime resolves the name Allocate returns.
  Status write_container_cdi_spec(const std::string& settings_dir) const {
    if (settings_dir.empty() || !config.edits_through_cdi()) return Status::Ok();
    const std::string id = std::filesystem::path(settings_dir).filename().string();
    return write_cdi_spec(container_cdi_spec_path(config.cdi_spec_dir, id),
                          cdi_spec_text(container_cdi_device(id), settings_edits(settings_dir)));
  }

  grpc::Status PreStartContainer(grpc::ServerContext*, const v1beta1::PreStartContainerRequest*,
                                 v1beta1::PreStartContainerResponse*) override {
    return grpc::Status::OK;
  }

  std::vector<ManagedGpu> gpus_snapshot() const {
    std::lock_guard lock(mu);
    return gpus;
  }

  // -- serving and registering (supervisor thread, or start/stop) --

  Status serve() {
    end_server();
    const std::string path = config.plugin_socket();
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return make_error("cannot remove the stale socket " + path + ": " + std::strerror(errno));
    }
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + path, grpc::InsecureServerCredentials());
    builder.RegisterService(this);
    server = builder.BuildAndStart();
    if (!server) return make_error("cannot serve the device plugin API on " + path);
    served_socket = socket_identity(path);
    std::lock_guard lock(mu);
    ++stats.serves;
    NVSHARE_INFO("serving the device plugin API on %s", path.c_str());
    return Status::Ok();
  }

  void end_server() {
    if (!server) return;
    {
      std::lock_guard lock(mu);
      ++generation;
    }
    changed.notify_all();
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server->Wait();
    server.reset();
    served_socket.reset();
  }

  Status register_with_kubelet() {
    auto channel =
        grpc::CreateChannel("unix:" + config.kubelet_socket(), grpc::InsecureChannelCredentials());
    auto stub = v1beta1::Registration::NewStub(channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + timing.rpc_timeout);
    v1beta1::RegisterRequest request;
    request.set_version(kDevicePluginApiVersion);
    request.set_endpoint(base_name(config.plugin_socket()));
    request.set_resource_name(config.resource_name);
    request.mutable_options()->set_get_preferred_allocation_available(true);
    request.mutable_options()->set_pre_start_required(false);
    v1beta1::Empty reply;
    const grpc::Status status = stub->Register(&context, request, &reply);
    if (!status.ok()) {
      return make_error("Register with " + config.kubelet_socket() + ": " + status.error_message());
    }
    return Status::Ok();
  }

  // The memory-capacity list the scheduler's capacity knob takes ("GPU-a=16Gi,GPU-b=80Gi").
  std::string capacity_list() const {
    std::string out;
    for (const ManagedGpu& gpu : gpus_snapshot()) {
      out += (out.empty() ? "" : ",") + gpu.uuid + "=" + std::to_string(gpu.capacity_bytes);
    }
    return out;
  }

  Status control_request(const control::Request& request, const char* what) {
    auto response = control::control_call(config.control_socket, request,
                                          static_cast<int>(timing.rpc_timeout.count()));
    if (!response) return response.error();
    auto refusal = control::decode_refusal(response.value());
    if (!refusal) return refusal.error();
    if (refusal.value()) {
      return make_error(std::string("the scheduler refused the ") + what + ": " +
                        refusal.value()->error);
    }
    return Status::Ok();
  }

  // What a new scheduler must learn from this node's inventory: the GPUs and their physical
  // memory (it takes a GPU's memory from the device, never from its clients), and the virtual
  // capacity when memory-capacity is set.
  Status push_inventory() {
    control::SetGpusRequest inventory_request;
    for (const ManagedGpu& gpu : gpus_snapshot()) {
      inventory_request.gpus.push_back(GpuInfo{
          gpu.uuid, static_cast<unsigned>(inventory_request.gpus.size()), gpu.memory_bytes});
    }
    if (Status s = control_request(inventory_request, "GPU inventory"); !s) return s;
    if (config.memory_capacity.empty()) return Status::Ok();
    control::SetPolicyRequest capacity;
    capacity.settings.emplace_back("capacity", capacity_list());
    return control_request(capacity, "capacity");
  }

  void poll_health() {
    std::vector<std::pair<std::string, Status>> results;
    for (const ManagedGpu& gpu : gpus_snapshot()) {
      results.emplace_back(gpu.uuid, inventory->check_health(gpu.uuid));
    }
    bool any_change = false;
    {
      std::lock_guard lock(mu);
      for (auto& [uuid, status] : results) {
        for (ManagedGpu& gpu : gpus) {
          if (gpu.uuid != uuid || gpu.healthy == status.ok()) continue;
          gpu.healthy = status.ok();
          any_change = true;
          ++stats.health_changes;
          if (status.ok()) {
            NVSHARE_INFO("GPU %s answers again: its slots are Healthy", uuid.c_str());
          } else {
            NVSHARE_WARN("GPU %s is unhealthy (%s): its slots are Unhealthy", uuid.c_str(),
                         status.error().message.c_str());
          }
        }
      }
      if (any_change) ++version;
    }
    if (any_change) changed.notify_all();
  }

  // Completes the containers' settings from pod-resources and the pod watcher; returns when the
  // next pass is due (soon while one waits for its pod's limit).
  Clock::time_point resolve_settings() {
    {
      std::lock_guard lock(settings_mu);
      if (!settings) return Clock::time_point::max();
    }
    auto listed = list_pods();
    std::vector<LiveContainer> live;
    if (listed) {
      for (const LivePod& pod : listed.value()) {
        for (const auto& devices : pod.containers) live.push_back(LiveContainer{pod.key, devices});
      }
    }
    const PodLimitsLookup lookup =
        pod_limits ? pod_limits : PodLimitsLookup([](const std::string&) {
          return std::optional<KnownPodLimits>(KnownPodLimits{});
        });
    std::lock_guard lock(settings_mu);
    // A failed list says nothing about which containers are gone: only claims are made from it.
    if (listed) settings->resolve(live, lookup, SteadyClock::instance().now());
    return Clock::now() + (settings->pending() > 0 ? std::chrono::milliseconds(100)
                                                   : std::chrono::milliseconds(2000));
  }

  void supervise() {
    using std::chrono::milliseconds;
    std::optional<FileIdentity> registered_kubelet;
    bool kubelet_recreated = false;
    auto register_backoff = timing.register_backoff_initial;
    auto next_register = Clock::now();
    auto next_health = Clock::now() + config.health_interval;
    auto next_settings = Clock::now();
    std::optional<FileIdentity> pushed_control;
    auto next_push = Clock::now();
    auto push_backoff = timing.register_backoff_initial;
    bool warned_register = false;

    while (true) {
      {
        std::lock_guard lock(mu);
        if (stopping) return;
      }
      const auto now = Clock::now();
      if (now >= next_health) {
        poll_health();
        next_health = Clock::now() + config.health_interval;
      }
      if (now >= next_settings) next_settings = resolve_settings();

      // Our socket: gone or replaced means the directory was wiped; serve again and re-register.
      const auto ours = socket_identity(config.plugin_socket());
      if (!ours || !served_socket || !(*ours == *served_socket)) {
        NVSHARE_WARN("%s was removed; serving again", config.plugin_socket().c_str());
        if (Status s = serve(); !s) {
          NVSHARE_ERROR("%s", s.error().message.c_str());
        }
        registered_kubelet.reset();
        next_register = Clock::now();
      }

      // The kubelet's socket: a new incarnation needs a new registration.
      const auto kubelet = socket_identity(config.kubelet_socket());
      if (!kubelet) {
        registered_kubelet.reset();
      } else if ((kubelet_recreated || !registered_kubelet || !(*kubelet == *registered_kubelet)) &&
                 Clock::now() >= next_register) {
        kubelet_recreated = false;
        if (Status s = register_with_kubelet(); s) {
          registered_kubelet = kubelet;
          register_backoff = timing.register_backoff_initial;
          warned_register = false;
          std::lock_guard lock(mu);
          ++stats.registrations;
          NVSHARE_INFO("registered %s with the kubelet (%s, endpoint %s)",
                       config.resource_name.c_str(), config.kubelet_socket().c_str(),
                       base_name(config.plugin_socket()).c_str());
        } else {
          {
            std::lock_guard lock(mu);
            ++stats.register_failures;
          }
          if (!warned_register) {
            NVSHARE_WARN("%s; retrying", s.error().message.c_str());
            warned_register = true;
          }
          next_register = Clock::now() + register_backoff;
          register_backoff = std::min(register_backoff * 2, timing.register_backoff_max);
        }
      }

      // Every new scheduler (a socket created anew) learns the inventory at once.
      if (Clock::now() >= next_push) {
        const auto control = socket_identity(config.control_socket);
        if (control && (!pushed_control || !(*control == *pushed_control))) {
          if (Status s = push_inventory(); s) {
            pushed_control = control;
            push_backoff = timing.register_backoff_initial;
            NVSHARE_INFO("pushed the GPU inventory%s to the scheduler",
                         config.memory_capacity.empty()
                             ? ""
                             : (" and memory capacity " + capacity_list()).c_str());
            std::lock_guard lock(mu);
            ++stats.capacity_pushes;
          } else {
            NVSHARE_WARN("cannot push the GPU inventory: %s", s.error().message.c_str());
            next_push = Clock::now() + push_backoff;
            push_backoff = std::min(push_backoff * 2, timing.register_backoff_max);
          }
        }
      }

      // Sleep until the next health poll, the periodic socket check, a retry, an inotify event or
      // stop().
      auto until =
          std::min({next_health, next_settings, Clock::now() + timing.socket_check_interval});
      if (kubelet && !(registered_kubelet && *kubelet == *registered_kubelet)) {
        until = std::min(until, next_register);
      }
      const auto wait = std::chrono::duration_cast<milliseconds>(until - Clock::now()).count();
      pollfd fds[2] = {{wake_fd, POLLIN, 0}, {inotify_fd, POLLIN, 0}};
      const int nfds = inotify_fd >= 0 ? 2 : 1;
      if (::poll(fds, nfds, static_cast<int>(std::max<long long>(wait, 0) + 1)) > 0 && nfds == 2 &&
          (fds[1].revents & POLLIN)) {
        // A new kubelet.sock needs a registration; a new control socket is checked at the top of
        // the loop anyway.
        kubelet_recreated |= drain_inotify();
      }
    }
  }

  // Reads pending inotify events (the kubelet's directory and the control socket's); true when
  // kubelet.sock was created.
  bool drain_inotify() {
    alignas(inotify_event) char buffer[4096];
    bool created = false;
    while (true) {
      const ssize_t n = ::read(inotify_fd, buffer, sizeof buffer);
      if (n <= 0) break;
      for (ssize_t offset = 0; offset < n;) {
        const auto* event = reinterpret_cast<const inotify_event*>(buffer + offset);
        if (event->wd == kubelet_watch && event->len > 0 &&
            std::strcmp(event->name, "kubelet.sock") == 0 &&
            (event->mask & (IN_CREATE | IN_MOVED_TO))) {
          created = true;
        }
        offset += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
      }
    }
    return created;
  }
};

// ---- PluginServer -------------------------------------------------------------------------------

PluginServer::PluginServer(PluginConfig config, std::unique_ptr<GpuInventory> inventory,
                           PluginServerTiming timing)
    : impl_(std::make_unique<Impl>(std::move(config), std::move(inventory), timing)) {}

PluginServer::~PluginServer() { stop(); }

void PluginServer::set_pod_limits_lookup(PodLimitsLookup lookup) {
  impl_->pod_limits = std::move(lookup);
}

void PluginServer::set_memory_limits_source(MemoryLimitsSource source) {
  impl_->memory_limits = std::move(source);
}

Status PluginServer::start() {
  Impl& impl = *impl_;
  if (impl.started) return make_error("the device plugin is already started");
  const PluginConfig& config = impl.config;

  auto listed = impl.inventory->list();
  if (!listed) return make_error("GPU inventory: " + listed.error().message);
  std::vector<ManagedGpu> gpus;
  for (const GpuInfo& info : listed.value()) {
    if (!config.gpus.selects(info.uuid, info.index)) continue;
    gpus.push_back(
        ManagedGpu{info.uuid, info.index,
                   config.memory_capacity.for_gpu(info.uuid, info.index, info.memory_bytes),
                   config.slots_per_gpu, true, info.memory_bytes});
  }
  for (const std::string& uuid : config.gpus.uuids) {
    if (std::none_of(gpus.begin(), gpus.end(),
                     [&](const ManagedGpu& g) { return g.uuid == uuid; })) {
      return make_error("gpus: no GPU " + uuid + " on this node");
    }
  }
  for (unsigned index : config.gpus.indexes) {
    if (std::none_of(gpus.begin(), gpus.end(),
                     [&](const ManagedGpu& g) { return g.index == index; })) {
      return make_error("gpus: no GPU with index " + std::to_string(index) + " on this node");
    }
  }
  for (const auto& entry : config.memory_capacity.by_uuid) {
    const std::string& uuid = entry.first;
    if (std::none_of(gpus.begin(), gpus.end(),
                     [&](const ManagedGpu& g) { return g.uuid == uuid; })) {
      return make_error("memory-capacity: " + uuid + " is not a managed GPU");
    }
  }
  if (gpus.empty()) return make_error("no GPU to manage (the node has none, or gpus selects none)");
  for (const ManagedGpu& gpu : gpus) {
    NVSHARE_INFO("managing GPU %u %s: %d slots, capacity %s", gpu.index, gpu.uuid.c_str(),
                 gpu.slots, format_bytes(gpu.capacity_bytes).c_str());
  }
  {
    std::lock_guard lock(impl.mu);
    impl.gpus = std::move(gpus);
    impl.stopping = false;
  }

  if (config.injection == Injection::kLdSoPreload) {
    if (Status s = write_ld_so_preload(config); !s) return s;
  }
  if (config.edits_through_cdi()) {
    const std::string path = client_cdi_spec_path(config.cdi_spec_dir);
    if (Status s = write_cdi_spec(path, cdi_spec_text(kCdiClientDevice, client_edits(config)));
        !s) {
      return make_error("cdi-spec-dir: " + s.error().message);
    }
    NVSHARE_INFO("CDI: wrote %s (device %s)", path.c_str(),
                 qualified_cdi_device(kCdiKind, kCdiClientDevice).c_str());
  }
  if (!config.settings_dir.empty()) {
    ContainerSettingsOptions options;
    options.dir = config.settings_dir;
    options.socket = config.socket_dir + "/scheduler.sock";
    options.register_wait = config.client_register_wait;
    if (config.edits_through_cdi()) {
      // A container's CDI spec goes with its settings directory.
      options.removed = [dir = config.cdi_spec_dir](const std::string& id) {
        std::error_code ignored;
        std::filesystem::remove(container_cdi_spec_path(dir, id), ignored);
      };
    }
    auto settings = std::make_unique<ContainerSettings>(std::move(options));
    if (Status s = settings->prepare(SteadyClock::instance().now()); !s) {
      return make_error("settings-dir: " + s.error().message);
    }
    // Specs a previous run left for containers whose directories are gone.
    if (config.edits_through_cdi()) {
      remove_stale_container_specs(config.cdi_spec_dir, settings->ids());
    }
    std::lock_guard lock(impl.settings_mu);
    impl.settings = std::move(settings);
  } else {
    NVSHARE_WARN(
        "settings-dir is empty: containers get no nvshare settings, so their environment can turn "
        "enforcement off");
  }

  impl.pod_resources = v1::PodResourcesLister::NewStub(grpc::CreateChannel(
      "unix:" + config.pod_resources_socket, grpc::InsecureChannelCredentials()));

  impl.wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl.wake_fd < 0) return make_error(std::string("eventfd: ") + std::strerror(errno));
  impl.inotify_fd = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  if (impl.inotify_fd >= 0) {
    impl.kubelet_watch = ::inotify_add_watch(impl.inotify_fd, config.kubelet_dir.c_str(),
                                             IN_CREATE | IN_DELETE | IN_MOVED_TO | IN_MOVED_FROM);
    // A restarted scheduler's control socket wakes the supervisor at once (best effort: the
    // periodic check finds it otherwise).
    const std::string control_dir =
        config.control_socket.substr(0, config.control_socket.find_last_of('/'));
    if (!control_dir.empty()) {
      (void)::inotify_add_watch(impl.inotify_fd, control_dir.c_str(), IN_CREATE | IN_MOVED_TO);
    }
  }
  if (impl.inotify_fd >= 0 && impl.kubelet_watch < 0) {
    NVSHARE_WARN("cannot watch %s (%s); checking its sockets every %lld ms",
                 config.kubelet_dir.c_str(), std::strerror(errno),
                 static_cast<long long>(impl.timing.socket_check_interval.count()));
    ::close(impl.inotify_fd);
    impl.inotify_fd = -1;
  }

  if (Status s = impl.serve(); !s) {
    ::close(impl.wake_fd);
    if (impl.inotify_fd >= 0) ::close(impl.inotify_fd);
    impl.wake_fd = impl.inotify_fd = -1;
    return s;
  }
  impl.started = true;
  impl.supervisor = std::thread([&impl] { impl.supervise(); });
  return Status::Ok();
}

void PluginServer::stop() {
  Impl& impl = *impl_;
  if (!impl.started) return;
  {
    std::lock_guard lock(impl.mu);
    impl.stopping = true;
  }
  impl.changed.notify_all();
  const std::uint64_t one = 1;
  (void)!::write(impl.wake_fd, &one, sizeof one);
  if (impl.supervisor.joinable()) impl.supervisor.join();
  const bool ours = impl.served_socket.has_value() &&
                    socket_identity(impl.config.plugin_socket()) == impl.served_socket;
  impl.end_server();
  if (ours) ::unlink(impl.config.plugin_socket().c_str());
  ::close(impl.wake_fd);
  if (impl.inotify_fd >= 0) ::close(impl.inotify_fd);
  impl.wake_fd = impl.inotify_fd = -1;
  impl.started = false;
  NVSHARE_INFO("device plugin stopped");
}

std::vector<ManagedGpu> PluginServer::gpus() const { return impl_->gpus_snapshot(); }

PluginServerStats PluginServer::stats() const {
  std::lock_guard lock(impl_->mu);
  return impl_->stats;
}

}  // namespace nvshare::deviceplugin
