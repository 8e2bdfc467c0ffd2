package pvesim

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
)

// Other cluster nodes. pvesim simulates one node in full; the guests
// seeded on other nodes (SeedGuest, Options.Guests) make those nodes
// members of the cluster, answering the calls a client makes about one
// of their guests: its status, stop and destroy, and the tasks those
// start. Every call on PVE goes to the node that runs the guest (the API
// proxies /nodes/{node}/... there, pve-http-server PVE/APIServer and
// pve-manager PVE/HTTPServer.pm); on another node's path the guest's
// config is missing: "Configuration file 'nodes/<node>/qemu-server/<vmid>.conf'
// does not exist" (qemu-server PVE/QemuConfig.pm load_config).

// Guest returns a guest seeded on another node (or a container), while it
// exists.
func (s *Server) Guest(vmid int) (GuestSpec, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g, ok := s.guests[vmid]
	return g, ok
}

// otherNodesLocked lists the other nodes: every node a guest was ever
// seeded on (a node stays when its last guest is destroyed).
func (s *Server) otherNodesLocked() []string {
	return s.otherNodes
}

func (s *Server) isOtherNode(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Contains(s.otherNodesLocked(), name)
}

// otherNodeEntry is another node in GET /nodes: online, nothing more
// (its usage is not modelled).
func otherNodeEntry(name string) map[string]any {
	return map[string]any{"id": "node/" + name, "type": "node", "node": name, "status": "online", "level": ""}
}

// routeOther answers the calls about another node's guests.
func (s *Server) routeOther(ctx context.Context, r *request, node string, rest []string) (any, *apiError) {
	if aerr := s.checkParams(r); aerr != nil {
		return nil, aerr
	}
	m := len(rest)
	get, post, del := r.method == http.MethodGet, r.method == http.MethodPost, r.method == http.MethodDelete
	switch {
	case m == 4 && rest[0] == "qemu" && rest[2] == "status" && rest[3] == "current" && get:
		g, aerr := s.otherGuest(r, node, rest[1], "VM.Audit")
		if aerr != nil {
			return nil, aerr
		}
		out := map[string]any{"vmid": g.VMID, "status": g.Status, "name": fmt.Sprintf("VM %d", g.VMID), "ha": map[string]any{"managed": 0}}
		if g.Name != "" {
			out["name"] = g.Name
		}
		if g.Tags != "" {
			out["tags"] = g.Tags
		}
		return out, nil
	case m == 4 && rest[0] == "qemu" && rest[2] == "status" && rest[3] == "stop" && post:
		g, aerr := s.otherGuest(r, node, rest[1], "VM.PowerMgmt")
		if aerr != nil {
			return nil, aerr
		}
		return s.startTaskOn(r, node, "qmstop", strconv.Itoa(g.VMID), func(ctx context.Context, t *task) error {
			if err := s.pause(ctx, s.opts.Profile.Stop); err != nil {
				return err
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			if cur, ok := s.guests[g.VMID]; ok && cur.Node == node {
				cur.Status = "stopped"
				s.guests[g.VMID] = cur
			}
			return nil
		}), nil
	case m == 2 && rest[0] == "qemu" && del:
		g, aerr := s.otherGuest(r, node, rest[1], "VM.Allocate")
		if aerr != nil {
			return nil, aerr
		}
		if g.Status == "running" {
			return nil, errf(500, "VM %d is running - destroy failed", g.VMID)
		}
		return s.startTaskOn(r, node, "qmdestroy", strconv.Itoa(g.VMID), func(ctx context.Context, t *task) error {
			if err := s.pause(ctx, s.opts.Profile.Delete); err != nil {
				return err
			}
			s.mu.Lock()
			delete(s.guests, g.VMID)
			s.mu.Unlock()
			t.logf("destroyed VM %d", g.VMID)
			return nil
		}), nil
	case m == 1 && rest[0] == "storage" && get:
		// storage.cfg is cluster-wide: another node lists the same
		// storages (that each is available there, as pvesim answers, is
		// unverified: storage.cfg's nodes option may exclude a node).
		return s.listStorage(r), nil
	case m == 3 && rest[0] == "tasks" && rest[2] == "status" && get:
		return s.taskStatus(r, rest[1])
	case m == 3 && rest[0] == "tasks" && rest[2] == "log" && get:
		return s.taskLog(r, rest[1])
	}
	return nil, errf(http.StatusNotImplemented, "pvesim: %s %s is not modelled on another node", r.method, r.path)
}

// otherGuest finds a qemu guest on node after checking priv on it.
func (s *Server) otherGuest(r *request, node, idStr, priv string) (GuestSpec, *apiError) {
	id, aerr := parseVMID(idStr)
	if aerr != nil {
		return GuestSpec{}, aerr
	}
	if aerr := r.who.check("/vms/"+strconv.Itoa(id), priv); aerr != nil {
		return GuestSpec{}, aerr
	}
	s.mu.Lock()
	g, ok := s.guests[id]
	s.mu.Unlock()
	if !ok || g.Node != node || g.Type == "lxc" {
		return GuestSpec{}, noConfig(node, id)
	}
	return g, nil
}
