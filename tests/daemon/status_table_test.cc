#include "tools/status_table.h"

#include <gtest/gtest.h>

#include <iterator>
#include <sstream>
#include <vector>

namespace nvshare::tools {
namespace {

TEST(StatusTable, RendersGpusClientsAndPods) {
  auto status = parse_json(R"({"ok":true,"gpus":[{"uuid":"GPU-1","mode":"auto",
      "capacity_bytes":1073741824,"capacity_virtual":true,"usable_bytes":966367641,
      "running_bytes":734003200,"quantum_ms":300,"last_epoch":4,"clients":[
      {"id":1,"pid":4242,"pod_uid":"7d3f","namespace":"ns","pod":"trainer","process":"python",
       "state":"running","waiting_for":null,"allocated_bytes":734003200,
       "memory_limit_bytes":2147483648,"core_limit_percent":30,"share_percent":29.5},
      {"id":2,"pid":4343,"pod_uid":null,"namespace":null,"pod":null,"process":"",
       "state":"waiting","waiting_for":"memory","allocated_bytes":734003200,
       "memory_limit_bytes":null,"core_limit_percent":100,"share_percent":0}]}],
      "pods":[{"pod_uid":"7d3f","namespace":"ns","name":"trainer","memory_limit_bytes":2147483648,
       "core_limit_percent":null,"clients":1}]})");
  ASSERT_TRUE(status.ok()) << status.error().message;
  const std::string text = render_status_table(status.value());
  EXPECT_NE(text.find("GPU GPU-1  mode auto  capacity 1Gi (virtual)"), std::string::npos) << text;
  EXPECT_NE(text.find("quantum 300ms"), std::string::npos) << text;
  EXPECT_NE(text.find("CLIENT  PID"), std::string::npos) << text;
  EXPECT_NE(text.find("ns/trainer"), std::string::npos) << text;
  EXPECT_NE(text.find("700Mi / 2Gi"), std::string::npos) << text;
  EXPECT_NE(text.find("30% / 29.5%"), std::string::npos) << text;
  EXPECT_NE(text.find("700Mi / none"), std::string::npos) << text;
  EXPECT_NE(text.find("none / 0%"), std::string::npos) << text;
  EXPECT_NE(text.find("waiting  memory"), std::string::npos) << text;
  EXPECT_NE(text.find("Pods with limits"), std::string::npos) << text;
}

// A holder revoked with a swap-out is shown swapping out, and past its grace late at it: a slow
// copy to the host reads as what it is, not as a hang; without a swap-out the state is the
// scheduler's.
TEST(StatusTable, AHolderSwappingOutIsShownSo) {
  auto status = parse_json(R"({"gpus":[{"uuid":"GPU-1","clients":[
      {"id":1,"pid":10,"state":"unresponsive","swapping_out":true,"allocated_bytes":0},
      {"id":2,"pid":11,"state":"revoking","swapping_out":true,"allocated_bytes":0},
      {"id":3,"pid":12,"state":"unresponsive","swapping_out":false,"allocated_bytes":0}]}]})");
  ASSERT_TRUE(status.ok()) << status.error().message;
  const std::string text = render_status_table(status.value());
  const auto row = [&](const std::string& pid) {
    const std::size_t at = text.find("  " + pid + "  ");
    return at == std::string::npos ? std::string() : text.substr(at, text.find('\n', at) - at);
  };
  EXPECT_NE(row("10").find("late-swap-out"), std::string::npos) << text;
  EXPECT_NE(row("11").find("swapping-out"), std::string::npos) << text;
  EXPECT_NE(row("12").find("unresponsive"), std::string::npos) << text;
}

// The scheduler's inventory: none known is said as such, not as a quiet node.
TEST(StatusTable, ASchedulerThatKnowsNoGpuIsSaidToRefuseClients) {
  const std::string none =
      render_status_table(parse_json(R"({"scheduler":{"gpus":[]},"gpus":[],"pods":[]})").value());
  EXPECT_NE(none.find("the scheduler knows no GPU"), std::string::npos) << none;
  const std::string quiet = render_status_table(
      parse_json(R"({"scheduler":{"gpus":["GPU-1","GPU-2"]},"gpus":[],"pods":[]})").value());
  EXPECT_EQ(quiet, "no GPU has clients yet (2 known)\n");
}

// Two samples 2 s apart: the pod's two processes held 0.6 s of GPU time together (30%), waited
// 1.4 s for quota (70%), and moved 1Gi out; a process outside pods has only one sample.
TEST(StatusTable, PodTableShowsRatesBetweenTwoSamples) {
  const auto sample = [](double held, double quota, double out, bool lone) {
    std::string text = R"({"gpus":[{"uuid":"GPU-1","clients":[
      {"id":1,"pid":10,"namespace":"ml","pod":"trainer","allocated_bytes":1073741824,
       "resident_bytes":1073741824,"memory_limit_bytes":2147483648,"core_limit_percent":30,
       "held_ms":)" + std::to_string(held) +
                       R"(,"waited_by_reason_ms":{"memory":0,"turn":0,"quota":)" +
                       std::to_string(quota) + R"(},"swapped_out_bytes":)" + std::to_string(out) +
                       R"(},
      {"id":2,"pid":11,"namespace":"ml","pod":"trainer","allocated_bytes":1073741824,
       "resident_bytes":0,"memory_limit_bytes":2147483648,"core_limit_percent":30,
       "held_ms":)" + std::to_string(held) +
                       R"(,"waited_by_reason_ms":{"quota":)" + std::to_string(quota) +
                       R"(},"swapped_out_bytes":0})";
    if (lone) text += R"(,{"id":3,"pid":77,"allocated_bytes":0,"core_limit_percent":100})";
    return parse_json(text + "]}]}").value();
  };
  const Json before = sample(1000, 500, 0, false);
  const Json after = sample(1300, 1200, 1073741824, true);
  const std::string text = render_pod_table(&before, after, 2.0);
  EXPECT_NE(text.find("POD"), std::string::npos) << text;
  const std::size_t row = text.find("ml/trainer");
  ASSERT_NE(row, std::string::npos) << text;
  const std::string line = text.substr(row, text.find('\n', row) - row);
  std::istringstream words(line);
  std::vector<std::string> cells{std::istream_iterator<std::string>(words), {}};
  ASSERT_GE(cells.size(), 10u) << text;
  // POD GPU PROCS CLASS SHARE CAP WAIT-MEM WAIT-TURN WAIT-QUOTA WAIT-CLASS
  EXPECT_EQ(std::vector<std::string>(cells.begin(), cells.begin() + 10),
            (std::vector<std::string>{"ml/trainer", "GPU-1", "2", "normal", "30.0%", "30%", "0.0%",
                                      "0.0%", "70.0%", "0.0%"}))
      << text;
  EXPECT_NE(line.find("2Gi / 1Gi / 2Gi"), std::string::npos) << text;
  EXPECT_NE(line.find("512Mi/s"), std::string::npos) << text;
  const std::size_t lone = text.find("pid 77");
  ASSERT_NE(lone, std::string::npos) << text;
  EXPECT_NE(text.substr(lone, text.find('\n', lone) - lone).find("-"), std::string::npos)
      << "no previous sample: no rates";
  EXPECT_EQ(render_pod_table(nullptr, parse_json(R"({"gpus":[]})").value(), 1), "no clients\n");
}

TEST(StatusTable, ToleratesMissingFields) {
  EXPECT_EQ(render_status_table(parse_json(R"({"ok":true})").value()), "no GPU has clients yet\n");
  const std::string text = render_status_table(
      parse_json(R"({"gpus":[{"uuid":"GPU-9","clients":[{"id":3}]}]})").value());
  EXPECT_NE(text.find("GPU GPU-9"), std::string::npos) << text;
  EXPECT_NE(text.find("3"), std::string::npos) << text;
}

}  // namespace
}  // namespace nvshare::tools
