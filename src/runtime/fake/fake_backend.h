// FakeBackend: sbx-agent as an ordinary child process, with NO isolation at all. For tests
// and development without root: same protocol, same exec/output/exit path as real sandboxes,
// but processes run on the host as the sbxd user (spec.user is ignored).
//
// Layout: <state_dir>/sandboxes/<id>/{agent.sock, agent.pid, agent.log, home/}.
// The agent is started with setsid, so it and every session process share its session id;
// Destroy() kills by session id (the agent puts each session in its own process group), and
// Freeze()/Thaw() stop and continue that whole session with SIGSTOP/SIGCONT.
#pragma once

#include <set>
#include <string>

#include "runtime/backend.h"

namespace sbx::runtime {

class FakeBackend : public Backend {
 public:
  // agent_buffer_bytes: the agent's --buffer-bytes (0 keeps the agent's default), so that
  // sbxd's --output-buffer-bytes means the same on every runtime.
  FakeBackend(std::string state_dir, std::string agent_path, size_t agent_buffer_bytes = 0);

  std::string Name() const override { return "fake"; }
  Capabilities GetCapabilities() const override { return Capabilities{.pause = true}; }
  absl::Status Probe() override;
  absl::StatusOr<InstancePtr> Create(const SandboxSpec& spec) override;
  absl::StatusOr<InstancePtr> Adopt(const std::string& id, const Json& persisted) override;
  absl::Status Remove(const std::string& id) override;
  absl::Status Sweep(const std::set<std::string>& known_ids) override;

 private:
  std::string SandboxDir(const std::string& id) const;
  // Kills the agent recorded in <dir>/agent.pid (if it still is that agent) with all its
  // processes, then removes the directory.
  absl::Status RemoveDir(const std::string& dir);

  std::string state_dir_;
  std::string agent_path_;
  size_t agent_buffer_bytes_ = 0;
};

}  // namespace sbx::runtime
