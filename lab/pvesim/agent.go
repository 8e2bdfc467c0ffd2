package pvesim

import (
	"strconv"
	"strings"
)

// The QEMU guest agent calls.

func (s *Server) agentInterfaces(r *request, idStr string) (any, *apiError) {
	if _, aerr := s.agentAvailable(r, idStr); aerr != nil {
		return nil, aerr
	}
	// What a running agent reports is not modelled.
	return map[string]any{"result": []any{}}, nil
}

// agentPing is the ping guest agent command (qemu-server
// src/PVE/API2/Qemu/Agent.pm at 9.2.6: POST, VM.GuestAgent.Audit or
// VM.GuestAgent.Unrestricted; {"result": {}} when the agent answers).
func (s *Server) agentPing(r *request, idStr string) (any, *apiError) {
	if _, aerr := s.agentAvailable(r, idStr); aerr != nil {
		return nil, aerr
	}
	return map[string]any{"result": map[string]any{}}, nil
}

// agentAvailable is assert_agent_available (qemu-server
// src/PVE/QemuServer/Agent.pm at 9.2.6) behind the command's privilege
// check: no agent option at all, then the VM not running, then no answer
// to guest-ping — which is also what agent: 0 gets, as QEMU then has no
// agent channel to ping. The guest answers when Options.GuestAgent says
// it runs the agent.
func (s *Server) agentAvailable(r *request, idStr string) (int, *apiError) {
	// The command's schema check is ['perm', '/vms/{vmid}', [$perm,
	// 'VM.GuestAgent.Unrestricted'], any => 1] since qemu-server 9.0.3
	// (commit b92a40ce), VM.Monitor alone before; check_any
	// (pve-access-control src/PVE/RPCEnvironment.pm at 9.1.1) names both in
	// its refusal: "(/vms/701, VM.GuestAgent.Audit|VM.GuestAgent.Unrestricted)".
	id, perr := parseVMID(idStr)
	if perr != nil {
		return 0, perr
	}
	privs := []string{"VM.Monitor"}
	if versionAtLeast(s.opts.QemuServer, 9, 0, 3) {
		privs = []string{"VM.GuestAgent.Audit", "VM.GuestAgent.Unrestricted"}
	}
	if aerr := r.who.checkAny("/vms/"+strconv.Itoa(id), privs...); aerr != nil {
		return id, aerr
	}
	v, id, aerr := s.vmByID(id)
	if aerr != nil {
		return 0, aerr
	}
	s.mu.Lock()
	conf, state := v.conf["agent"], v.state
	s.mu.Unlock()
	switch {
	case conf == "":
		return id, errf(500, "No QEMU guest agent configured")
	case state != "running":
		return id, errf(500, "VM %d is not running", id)
	case !agentEnabled(conf) || s.opts.GuestAgent == nil || !s.opts.GuestAgent(id):
		return id, errf(500, "QEMU guest agent is not running")
	}
	return id, nil
}

// agentEnabled reads the agent option's enabled flag (parse_guest_agent:
// "1", "enabled=1,…", "0", "enabled=0").
func agentEnabled(a string) bool {
	return a != "" && a != "0" && !strings.HasPrefix(a, "0,") && !strings.Contains(a, "enabled=0")
}
