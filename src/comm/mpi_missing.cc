// make_mpi_communicator in a build without MPI (-DFLEXCP_WITH_MPI=OFF): the local communicator
// and everything on one rank work; asking for MPI says how to get it.
#include "flexcp/comm.h"
#include "flexcp/status.h"

namespace flexcp {

std::unique_ptr<Communicator> make_mpi_communicator(const MpiOptions&) {
  throw Error(Status::kNotCompiled,
              "flexcp::make_mpi_communicator: this build has no MPI (configured with "
              "-DFLEXCP_WITH_MPI=OFF); install Open MPI (apt-get install -y libopenmpi-dev "
              "openmpi-bin) and configure with -DFLEXCP_WITH_MPI=ON");
}

}  // namespace flexcp
