#include "tools/status_table.h"

#include <gtest/gtest.h>

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

TEST(StatusTable, ToleratesMissingFields) {
  EXPECT_EQ(render_status_table(parse_json(R"({"ok":true})").value()), "no GPU has clients yet\n");
  const std::string text = render_status_table(
      parse_json(R"({"gpus":[{"uuid":"GPU-9","clients":[{"id":3}]}]})").value());
  EXPECT_NE(text.find("GPU GPU-9"), std::string::npos) << text;
  EXPECT_NE(text.find("3"), std::string::npos) << text;
}

}  // namespace
}  // namespace nvshare::tools
