package pvesim

import (
	"path"
	"strings"
)

type faultRule struct {
	Fault
	seen  int
	fired int
}

// InjectFault adds a fault; see Fault for how it matches and fires.
func (s *Server) InjectFault(f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, &faultRule{Fault: f})
}

// ClearFaults removes every injected fault.
func (s *Server) ClearFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = nil
}

// FaultsFired counts how often injected faults have fired since the last ClearFaults.
func (s *Server) FaultsFired() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, f := range s.faults {
		n += f.fired
	}
	return n
}

// fireFault returns the first fault that fires for this request, if any.
func (s *Server) fireFault(method, p string) *Fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.faults {
		if f.Method != "" && !strings.EqualFold(f.Method, method) {
			continue
		}
		if f.Path != "" && !globMatch(f.Path, p) {
			continue
		}
		if f.Times > 0 && f.fired >= f.Times {
			continue
		}
		f.seen++
		if f.seen <= f.Skip {
			continue
		}
		if f.Probability > 0 && f.Probability < 1 && s.rng.Float64() >= f.Probability {
			continue
		}
		f.fired++
		s.log.Debug().Str("kind", string(f.Kind)).Str("method", method).Str("path", p).Msg("pvesim fault fired")
		out := f.Fault
		return &out
	}
	return nil
}

func globMatch(pattern, p string) bool {
	if pattern == "" {
		return true
	}
	ok, err := path.Match(pattern, p)
	return err == nil && ok
}
