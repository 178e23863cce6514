#include "scheduler/pod_identity.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

namespace nvshare::scheduler {
namespace {

constexpr const char* kUid = "7d3f9a2e-1c4b-4e8f-9a6d-2b5c8e1f0a3d";
constexpr const char* kContainer =
    "4f1c2b3a5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708";

struct Case {
  const char* name;
  std::string cgroup;                       // the text of /proc/<pid>/cgroup
  std::optional<std::string> pod_uid;       // expected
  std::optional<std::string> container_id;  // expected
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class PodIdentityParse : public ::testing::TestWithParam<Case> {};

TEST_P(PodIdentityParse, FindsThePodUid) {
  const PodIdentity identity = parse_pod_identity(GetParam().cgroup);
  EXPECT_EQ(identity.pod_uid, GetParam().pod_uid) << GetParam().cgroup;
  EXPECT_EQ(identity.container_id, GetParam().container_id) << GetParam().cgroup;
}

const std::string kSystemdUid = "7d3f9a2e_1c4b_4e8f_9a6d_2b5c8e1f0a3d";
const std::string C = kContainer;

INSTANTIATE_TEST_SUITE_P(
    Shapes, PodIdentityParse,
    ::testing::Values(
        // cgroup v2, systemd driver: containerd, CRI-O, Docker (cri-dockerd).
        Case{"v2_systemd_containerd_burstable",
             "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + kSystemdUid +
                 ".slice/cri-containerd-" + C + ".scope\n",
             kUid, C},
        Case{"v2_systemd_containerd_besteffort",
             "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + kSystemdUid +
                 ".slice/cri-containerd-" + C + ".scope\n",
             kUid, C},
        Case{"v2_systemd_guaranteed",
             "0::/kubepods.slice/kubepods-pod" + kSystemdUid + ".slice/cri-containerd-" + C +
                 ".scope\n",
             kUid, C},
        Case{"v2_systemd_crio",
             "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + kSystemdUid +
                 ".slice/crio-" + C + ".scope\n",
             kUid, C},
        Case{"v2_systemd_crio_conmon",
             "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + kSystemdUid +
                 ".slice/crio-conmon-" + C + ".scope\n",
             kUid, C},
        Case{"v2_systemd_docker",
             "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + kSystemdUid +
                 ".slice/docker-" + C + ".scope\n",
             kUid, C},
        // A process in a nested cgroup under its container's scope.
        Case{"v2_systemd_nested_below_scope",
             "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + kSystemdUid +
                 ".slice/cri-containerd-" + C + ".scope/init\n",
             kUid, C},
        // kind and other kubelet-in-a-slice setups.
        Case{"v2_systemd_kubelet_slice",
             "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
             "kubelet-kubepods-besteffort-pod" +
                 kSystemdUid + ".slice/cri-containerd-" + C + ".scope\n",
             kUid, C},
        // cgroup v2, cgroupfs driver.
        Case{"v2_cgroupfs", std::string("0::/kubepods/burstable/pod") + kUid + "/" + C + "\n", kUid,
             C},
        Case{"v2_cgroupfs_guaranteed", std::string("0::/kubepods/pod") + kUid + "/" + C + "\n",
             kUid, C},
        // Seen from a scheduler in its own cgroup namespace: paths relative to its own cgroup.
        Case{"v2_cgroup_namespace_cgroupfs", std::string("0::/../../pod") + kUid + "/" + C + "\n",
             kUid, C},
        Case{"v2_cgroup_namespace_systemd",
             "0::/../../kubepods-besteffort-pod" + kSystemdUid + ".slice/cri-containerd-" + C +
                 ".scope\n",
             kUid, C},
        // cgroup v1, cgroupfs driver (every hierarchy names the pod; the first wins).
        Case{"v1_cgroupfs",
             std::string("12:memory:/kubepods/besteffort/pod") + kUid + "/" + C + "\n" +
                 "11:cpu,cpuacct:/kubepods/besteffort/pod" + kUid + "/" + C + "\n" +
                 "1:name=systemd:/kubepods/besteffort/pod" + kUid + "/" + C + "\n",
             kUid, C},
        // cgroup v1, systemd driver, containerd: the slice:runtime:id form.
        Case{"v1_systemd_containerd",
             "12:memory:/system.slice/containerd.service/kubepods-burstable-pod" + kSystemdUid +
                 ".slice:cri-containerd:" + C + "\n",
             kUid, C},
        Case{"v1_systemd_docker",
             "10:devices:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" +
                 kSystemdUid + ".slice/docker-" + C + ".scope\n",
             kUid, C},
        // Hybrid hierarchy: v1 controllers plus the unified line; lines without a pod are skipped.
        Case{"hybrid",
             std::string("13:misc:/\n12:memory:/user.slice\n0::/kubepods/besteffort/pod") + kUid +
                 "/" + C + "\n",
             kUid, C},
        // The pod's own cgroup (a pause process, or a runtime without per-container cgroups).
        Case{"pod_cgroup_only", std::string("0::/kubepods/besteffort/pod") + kUid + "\n", kUid,
             std::nullopt},
        // Uppercase hex is canonicalized; no trailing newline is fine.
        Case{"uppercase", "0::/kubepods/besteffort/pod7D3F9A2E-1C4B-4E8F-9A6D-2B5C8E1F0A3D/" + C,
             kUid, C},
        // A short container ID that is not hex is not reported; the pod still is.
        Case{"odd_container_segment", std::string("0::/kubepods/pod") + kUid + "/sandbox\n", kUid,
             std::nullopt},
        // Not in a pod.
        Case{"host_process", "0::/user.slice/user-1000.slice/session-3.scope\n", std::nullopt,
             std::nullopt},
        Case{"systemd_service", "0::/system.slice/containerd.service\n", std::nullopt,
             std::nullopt},
        Case{"docker_outside_kubernetes", "0::/system.slice/docker-" + C + ".scope\n", std::nullopt,
             std::nullopt},
        Case{"podman", "0::/machine.slice/libpod-" + C + ".scope\n", std::nullopt, std::nullopt},
        Case{"root_cgroup", "0::/\n", std::nullopt, std::nullopt},
        Case{"empty", "", std::nullopt, std::nullopt},
        // Look-alikes that must not be taken for a pod.
        Case{"uuid_without_pod_prefix", std::string("0::/kubepods/besteffort/") + kUid + "/x\n",
             std::nullopt, std::nullopt},
        Case{"pod_prefix_inside_a_word", std::string("0::/kubepods/besteffort/ipod") + kUid + "\n",
             std::nullopt, std::nullopt},
        Case{"slice_without_kubepods", "0::/user.slice/user-pod" + kSystemdUid + ".slice\n",
             std::nullopt, std::nullopt},
        Case{"mixed_separators",
             "0::/kubepods/besteffort/pod7d3f9a2e-1c4b_4e8f-9a6d-2b5c8e1f0a3d/" + C + "\n",
             std::nullopt, std::nullopt},
        Case{"truncated_uid", "0::/kubepods/besteffort/pod7d3f9a2e-1c4b-4e8f-9a6d-2b5c8e1f0a3/x\n",
             std::nullopt, std::nullopt},
        Case{"non_hex_uid", "0::/kubepods/besteffort/pod7d3f9a2e-1c4b-4e8f-9a6d-2b5c8e1f0a3g/x\n",
             std::nullopt, std::nullopt},
        Case{"garbage", "not a cgroup file\n\n::\n:::\n", std::nullopt, std::nullopt},
        // A logged-in user owns a delegated subtree and may name cgroups there after any pod.
        Case{"user_delegated_cgroupfs_form",
             std::string("0::/user.slice/user-1000.slice/user@1000.service/app.slice/pod") + kUid +
                 "/" + C + "\n",
             std::nullopt, std::nullopt},
        Case{"user_delegated_systemd_form",
             "0::/user.slice/user-1000.slice/user@1000.service/kubepods.slice/"
             "kubepods-burstable-pod" +
                 kSystemdUid + ".slice/cri-containerd-" + C + ".scope\n",
             std::nullopt, std::nullopt},
        Case{"pod_segment_outside_kubepods",
             std::string("0::/system.slice/pod") + kUid + "/" + C + "\n", std::nullopt,
             std::nullopt}),
    [](const ::testing::TestParamInfo<Case>& test) { return std::string(test.param.name); });

// Refused pod segments say why, so the scheduler can.
TEST(PodIdentityParse, ARefusedPodSegmentSaysWhy) {
  const PodIdentity user = parse_pod_identity(
      std::string("0::/user.slice/user-1000.slice/user@1000.service/pod") + kUid + "/x\n");
  EXPECT_EQ(user.pod_uid, std::nullopt);
  ASSERT_TRUE(user.refused.has_value());
  EXPECT_NE(user.refused->find("inside a user's delegated cgroup tree"), std::string::npos);
  const PodIdentity outside = parse_pod_identity(std::string("0::/custom/pod") + kUid + "\n");
  ASSERT_TRUE(outside.refused.has_value());
  EXPECT_NE(outside.refused->find("outside the kubelet's kubepods hierarchy"), std::string::npos);
  EXPECT_EQ(parse_pod_identity(std::string("0::/kubepods/pod") + kUid + "\n").refused,
            std::nullopt);
}

TEST(PodIdentityCgroup, TheUnifiedHierarchyNamesTheCgroup) {
  // v1 lines first, then the unified one (a hybrid layout): the unified path is the process's.
  EXPECT_EQ(parse_pod_identity("12:memory:/user.slice\n1:name=systemd:/user.slice/a.scope\n"
                               "0::/user.slice/user-1000.slice/session-4.scope\n")
                .cgroup,
            "/user.slice/user-1000.slice/session-4.scope");
  // v1 alone: the first line's path.
  EXPECT_EQ(parse_pod_identity("12:memory:/docker/abc\n11:cpu:/docker/def\n").cgroup,
            "/docker/abc");
  EXPECT_EQ(parse_pod_identity("0::/\n").cgroup, "/");
  // A pod's process: the pod is found and the cgroup is the container's.
  const PodIdentity pod = parse_pod_identity(std::string("0::/kubepods/burstable/pod") + kUid +
                                             "/" + kContainer + "\n");
  EXPECT_EQ(pod.pod_uid, kUid);
  EXPECT_EQ(pod.cgroup, std::string("/kubepods/burstable/pod") + kUid + "/" + kContainer);
  EXPECT_EQ(parse_pod_identity("garbage\n").cgroup, "");
}

TEST(PodIdentityRead, ReadsAFileUnderAProcRoot) {
  char tmpl[] = "/tmp/nvshare-proc-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string root = tmpl;
  ASSERT_EQ(::mkdir((root + "/4242").c_str(), 0755), 0);
  std::ofstream(root + "/4242/cgroup")
      << "0::/kubepods/burstable/pod" << kUid << "/" << kContainer << "\n";
  auto identity = read_pod_identity(4242, root);
  ASSERT_TRUE(identity.ok()) << identity.error().message;
  EXPECT_EQ(identity.value().pod_uid, kUid);

  auto missing = read_pod_identity(4243, root);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("4243/cgroup"), std::string::npos);
  std::system(("rm -rf " + root).c_str());
}

TEST(PodIdentityRead, ThisProcessIsReadable) {
  // Whatever this machine's cgroup layout, reading our own file succeeds (a pod or no pod).
  EXPECT_TRUE(read_pod_identity(::getpid()).ok());
}

}  // namespace
}  // namespace nvshare::scheduler
