// An ELF in front of tests/e2e/hostile_agent.py: sbxd's preflight accepts only an ELF as
// --agent-path (a script there is a misconfiguration for every real use). Runs the script with
// python3 and the arguments sbxd gave, so its cmdline still carries "--listen SOCKET" (the
// fake runtime recognises its agents by that).
#include <unistd.h>

#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  std::vector<char*> args = {const_cast<char*>("python3"),
                             const_cast<char*>(SBX_HOSTILE_AGENT_SCRIPT)};
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  ::execvp("python3", args.data());
  std::perror("hostile-agent: execvp(python3)");
  return 127;
}
