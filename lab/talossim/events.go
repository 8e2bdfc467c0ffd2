package talossim

import (
	"fmt"
	"strings"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// runtimeEvent is one entry of the node's runtime event stream (machined's
// events ring, internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_events.go
// at v1.13.3): the events of one sequence carry its actor ID, which the
// API call that started it returns (Upgrade's ActorId), so a client can
// follow exactly that sequence. Only the events the product reads are
// published: an upgrade sequence's start and its failure, the service
// state events of etcd, cri and kubelet (serviceEventAtLocked) and every
// machine status change (setStageLocked).
type runtimeEvent struct {
	seq     uint64
	actorID string
	payload proto.Message
}

// publishEventLocked appends an event and wakes the streams; n.mu is held.
// The ring lives in machined's memory: a reboot empties it.
func (n *Node) publishEventLocked(actorID string, payload proto.Message) {
	n.eventSeq++
	n.events = append(n.events, runtimeEvent{seq: n.eventSeq, actorID: actorID, payload: payload})
	if n.eventsWake != nil {
		close(n.eventsWake)
	}
	n.eventsWake = make(chan struct{})
}

// Events implements machine.MachineServiceServer as v1alpha1_server.go
// Events does at v1.13.3: an empty hello event first, then the tail
// asked for (TailEvents: -1 all, n the last n, 0 none), then every new
// event, filtered by WithActorId, until the client goes or the API stops.
// TailId and TailSeconds are not simulated.
func (a *apid) Events(req *machine.EventsRequest, srv machine.MachineService_EventsServer) error {
	if req.GetTailId() != "" || req.GetTailSeconds() != 0 {
		return fmt.Errorf("talossim: tail_id and tail_seconds are not simulated")
	}
	if err := srv.Send(&machine.Event{ActorId: req.GetWithActorId()}); err != nil {
		return err
	}
	n := a.n
	n.mu.Lock()
	var cursor uint64
	if len(n.events) > 0 {
		cursor = n.events[len(n.events)-1].seq
		switch t := int(req.GetTailEvents()); {
		case t < 0:
			cursor = 0
		case t > 0 && t < len(n.events):
			cursor = n.events[len(n.events)-t-1].seq
		case t > 0:
			cursor = 0
		}
	}
	n.mu.Unlock()
	for {
		n.mu.Lock()
		var batch []runtimeEvent
		for _, e := range n.events {
			if e.seq > cursor {
				batch = append(batch, e)
			}
		}
		if n.eventsWake == nil {
			n.eventsWake = make(chan struct{})
		}
		wake := n.eventsWake
		n.mu.Unlock()
		for _, e := range batch {
			cursor = e.seq
			if id := req.GetWithActorId(); id != "" && e.actorID != id {
				continue
			}
			// machined's own type URL, not anypb's
			// (internal/app/machined/pkg/runtime/events.go NewEvent):
			// clients match on it (client.UnmarshalEvent).
			value, err := proto.Marshal(e.payload)
			if err != nil {
				return err
			}
			data := &anypb.Any{TypeUrl: "talos/runtime/" + string(e.payload.ProtoReflect().Descriptor().FullName()), Value: value}
			if err := srv.Send(&machine.Event{Data: data, Id: fmt.Sprintf("%020d", e.seq), ActorId: e.actorID}); err != nil {
				return err
			}
		}
		select {
		case <-srv.Context().Done():
			return nil
		case <-wake:
		}
	}
}

// serviceEventAtLocked publishes, at at, the service state event machined
// publishes when a service changes state or its health check changes
// verdict (ServiceRunner.UpdateState and healthUpdate,
// internal/app/machined/pkg/system/service_runner.go at v1.13.3, as
// events.ServiceEvent.AsProto builds it): the service, its state, the
// message of its last event and its health, as ServiceList reports them
// then. The simulator computes a service's state from the time, so the
// event goes out at the times its state is known to change: etcd running
// and then healthy (its member's start and ready times), cri healthy
// once the node is up from its install (cri is health-checked:
// internal/app/machined/pkg/system/services/cri.go HealthFunc), kubelet
// healthy.
// Other services publish nothing (not simulated). n.mu is held; a reboot
// before at cancels it (afterLocked), as it ends the services.
func (n *Node) serviceEventAtLocked(at time.Time, service string) {
	n.afterLocked(max(0, time.Until(at)), func() {
		if n.phase != PhaseRunning {
			return
		}
		for _, si := range n.servicesLocked(false, time.Now()) {
			if si.GetId() != service {
				continue
			}
			evs := si.GetEvents().GetEvents()
			if len(evs) == 0 {
				return
			}
			last := evs[len(evs)-1]
			action := machine.ServiceStateEvent_Action(machine.ServiceStateEvent_Action_value[strings.ToUpper(last.GetState())])
			n.publishEventLocked("", &machine.ServiceStateEvent{Service: service, Action: action, Message: last.GetMsg(), Health: si.GetHealth()})
		}
	})
}
